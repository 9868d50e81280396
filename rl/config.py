"""Typed training configuration: the schema behind ``conf/`` (Hydra structured configs).

``sao-train`` composes ``conf/config.yaml`` and its groups (``algo``, ``env``, ``model``, ``engine``,
``rollout``, ``logger``) on top of :class:`TrainConfig`, so a misspelled key or a wrong type fails
at once with Hydra's message, then converts the result into these dataclasses. Below the CLI,
only these typed objects travel; no ``DictConfig`` is passed around.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import MISSING

from sao.agents.engine import SpeculativeConfig, check_schedule
from sao.hints import did_you_mean
from sao.rl.errors import ConfigError
from sao.rl.learner import LrSchedule


LOSSES = ("dis", "ppo")  # algo.loss: the policy losses (sao.rl.algos.policy_losses.LOSSES builds them)
SFT_LOSS = "ce"  # algo=sft's loss: cross-entropy on the demonstrations' action tokens (sao.rl.algos.sft)


@dataclass
class AlgoConfig:
    """What every algorithm takes: its ``name`` (the ``algo=`` option), samples per prompt, the policy loss
    and its knobs, and how the loss is aggregated. Each algorithm has its own config below, which
    adds its knobs (:data:`ALGO_CONFIGS`); ``algo=NAME`` composes that one (``conf/algo/NAME.yaml`` over
    the schema ``schema/algo/NAME``), so an option the algorithm does not have fails at once."""

    name: str = MISSING
    group_size: int = 1  # samples per prompt: 1 for single-rollout methods, G for GRPO
    loss: str = "dis"  # dis | ppo (the policy loss; see sao.rl.algos.policy_losses.LOSSES)
    # DIS band (1 - eps_low, 1 + eps_high) or PPO clip range; None: by the environment's domain for DIS
    # (DIS_BANDS: math 0.3 / 5.0, coding 0.8 / 3.0) and 0.2 / 0.28 for PPO (resolve_defaults)
    eps_low: float | None = None
    eps_high: float | None = None
    dual_clip_c: float | None = None  # PPO dual-clip constant (> 1), None: off
    is_correction: str = "none"  # PPO only: none (clip against the behaviour policy) | tis | icepop (decoupled PPO)
    is_cap: float = 2.0  # tis: min(pi_old / pi_rollout, is_cap)
    icepop_low: float = 0.5  # icepop: weight 0 outside [icepop_low, icepop_high]
    icepop_high: float = 2.0
    agg: str = "token-mean"  # token-mean | seq-mean-token-mean | token-sum-norm
    agg_normalizer: float | None = None  # token-sum-norm's constant (e.g. the max generation length)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ConfigError(f"algo.loss must be 'dis' or 'ppo', got {self.loss!r}")

    def learner_options(self) -> dict[str, Any]:
        """The :class:`~sao.rl.learner.learner.LearnerConfig` fields this config sets."""
        return {"agg": self.agg, "agg_normalizer": self.agg_normalizer}


@dataclass
class CriticAlgoConfig(AlgoConfig):
    """An algorithm with a value model: its discount, its steps per policy step and how it trains."""

    gamma: float = 1.0
    ttur_k: int = 2  # value steps per policy step (two-timescale update)
    value_clip: float | None = 0.2
    freeze_value_attention: bool = True
    # the value head fitted in closed form (a ridge regression on the frozen trunk's features, every batch so
    # far, each older batch weighted by value_head_decay once more; sao.rl.learner.ridge_head) instead of the
    # trained critic: the ridge penalty on standardised features, or null
    value_head_ridge: float | None = None
    value_head_decay: float = 1.0
    # false: a batch whose rewards are all equal trains the critic but takes no policy step (it says nothing
    # about which actions are better, yet its critic-error advantages move the policy a full Adam step:
    # docs/results/critic.md); true: every batch steps, as the paper
    step_on_equal_rewards: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ttur_k < 1:
            raise ConfigError(f"algo.ttur_k must be >= 1, got {self.ttur_k}")
        if self.value_head_ridge is not None and not self.value_head_ridge > 0:
            raise ConfigError(f"algo.value_head_ridge must be > 0 or null, got {self.value_head_ridge}")
        if not 0 < self.value_head_decay <= 1:
            raise ConfigError(f"algo.value_head_decay must be in (0, 1], got {self.value_head_decay}")

    def learner_options(self) -> dict[str, Any]:
        return super().learner_options() | {"value_clip": self.value_clip,
                                            "freeze_value_attention": self.freeze_value_attention,
                                            "value_head_ridge": self.value_head_ridge,
                                            "value_head_decay": self.value_head_decay}


@dataclass
class SAOConfig(CriticAlgoConfig):
    """SAO (METHOD.md 1): one rollout per prompt, a value model, length-adaptive GAE, DIS."""

    name: str = "sao"
    lam: float | None = None  # None: lambda_policy = 1 - 1 / (alpha * action_tokens); a float: fixed
    alpha: float = 1.5


@dataclass
class PPOConfig(CriticAlgoConfig):
    """PPO with a value model and a fixed lambda (the VAPO-like ablation), PPO's clip."""

    name: str = "ppo"
    loss: str = "ppo"
    lam: float | None = 0.95  # the policy's fixed GAE lambda

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lam is None:
            raise ConfigError("algo=ppo needs a fixed algo.lam (e.g. 0.95)")


@dataclass
class GRPOConfig(AlgoConfig):
    """GRPO: G samples per prompt, group-relative advantages, PPO's clip."""

    name: str = "grpo"
    group_size: int = 4
    loss: str = "ppo"
    scale_by_std: bool = True  # divide by the group std; False: Dr.GRPO

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ConfigError(f"GRPO needs algo.group_size >= 2 (samples per prompt), got {self.group_size}")


@dataclass
class GRPODISConfig(GRPOConfig):
    """GRPO's group advantages with SAO's DIS mask instead of PPO's clip."""

    name: str = "grpo_dis"
    loss: str = "dis"


@dataclass
class SFTConfig(AlgoConfig):
    """A warm start from demonstrations (``algo=sft``, :mod:`sao.rl.algos.sft`): cross-entropy on the action
    tokens of episodes a scripted ``demonstrator`` (:data:`sao.rl.warm_start.DEMONSTRATORS`) plays through the
    agent loop on the training split; held-out accuracy with ``eval.patience`` says when to stop."""

    name: str = "sft"
    loss: str = SFT_LOSS
    demonstrator: str = "arithmetic_tool"
    # a demonstration is kept only when the environment rewarded it at least this much (1: solved)
    min_reward: float = 1.0

    def __post_init__(self) -> None:
        if self.loss != SFT_LOSS:
            raise ConfigError(f"algo=sft trains with cross-entropy (algo.loss={SFT_LOSS}), not {self.loss!r}")
        if self.group_size != 1:
            raise ConfigError(f"algo=sft takes one demonstration per prompt; set algo.group_size=1, not {self.group_size}")


@dataclass
class ReinforceMeanConfig(AlgoConfig):
    """One rollout per prompt, a running-mean baseline, DIS."""

    name: str = "reinforce_mean"
    baseline_window: int = 8  # rewards in the running mean

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size != 1:
            raise ConfigError(f"reinforce_mean samples one rollout per prompt; set algo.group_size=1, "
                              f"not {self.group_size}")


ALGO_CONFIGS: dict[str, type[AlgoConfig]] = {
    "sao": SAOConfig, "ppo": PPOConfig, "grpo": GRPOConfig, "grpo_dis": GRPODISConfig,
    "reinforce_mean": ReinforceMeanConfig, "sft": SFTConfig,
}
"""Each ``algo=`` option's config; :data:`sao.rl.algos.ALGORITHMS` holds their classes under the same names."""


def algo_options(name: str) -> list[str]:
    """The options ``algo=name`` takes (``algo.<option>=...``). :class:`ConfigError` for an unknown name."""
    cls = ALGO_CONFIGS.get(name)
    if cls is None:
        raise ConfigError(f"unknown algo {name!r} (known: {', '.join(ALGO_CONFIGS)})."
                          f"{did_you_mean(name, list(ALGO_CONFIGS))}")
    return [f.name for f in fields(cls)]


def algo_config(name: str, **options: Any) -> AlgoConfig:
    """``algo=name``'s config with ``options`` set. An option the algorithm does not have is a
    :class:`ConfigError` that names the ones it has."""
    known = algo_options(name)
    for key in options:
        if key not in known:
            raise ConfigError(unknown_option(name, key, known))
    return ALGO_CONFIGS[name](**options)


def unknown_option(name: str, key: str, known: list[str]) -> str:
    """The message for ``algo.<key>`` that ``algo=name`` does not have."""
    return (f"algo={name} has no option {key!r} (its options: {', '.join(k for k in known if k != 'name')})."
            f"{did_you_mean(key, known)}")


@dataclass
class OptimConfig:
    lr: float = 3e-5  # the 135M CPU demo; the paper (30B) uses 1e-6 (see conf/config.yaml)
    value_lr: float | None = None  # None: 5 x lr (METHOD.md 1.2)
    value_warmup_steps: int = 10
    # the value model's fresh head at its own lr (docs/results/critic.md); None: the value lr
    value_head_lr: float | None = None
    # the policy lr over the run: constant, or linear | cosine decay to min_lr_ratio x lr at max_steps
    lr_decay: str = "constant"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0
    # tokens per micro-batch (exact gradient accumulation); bounds the activations' memory whatever
    # the batch holds. None: the whole batch at once
    token_budget: int | None = 256
    # lay each micro-batch's rows end to end without padding (sao.rl.learner.packing); token_budget then
    # counts real tokens. false: right-padded rows (token_budget counts padded tokens)
    pack: bool = True
    # bf16 autocast of the policy's passes. Off by default: on the CPU it puts 0.03-0.07 of mean
    # |log-prob| noise between learner and an fp32 engine on sampled tokens (measured, issue 13),
    # which is the whole DIS budget; on GPUs with a bf16 engine, turn it on.
    bf16: bool = False
    # bf16 autocast of the value model's passes: auto (where bf16 is fast: CUDA, a CPU with AMX, or
    # one with AVX512-BF16 where a measurement cached per machine says so; sao.rl.learner.precision), true,
    # false, or null (as bf16)
    critic_bf16: Any = "auto"

    def __post_init__(self) -> None:
        if self.critic_bf16 not in ("auto", True, False, None):
            raise ValueError(f"optim.critic_bf16 must be auto, true, false or null, got {self.critic_bf16!r}")
        try:  # the run's steps are checked where they are known (TrainConfig)
            LrSchedule(self.lr_decay, 1, self.min_lr_ratio)
        except ValueError as exc:
            raise ValueError(f"optim: {exc}") from exc


@dataclass
class EnvConfig:
    """The environment the policy trains on (a registered name or short name) and its arguments."""

    name: str = "arithmetic"
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 1
    # generated tokens per trajectory, all turns together; None: no budget, engine.max_model_len bounds it
    max_tokens: int | None = 256
    max_tokens_per_turn: int | None = None  # a cap on one turn's answer; None: what is left of max_tokens
    domain: str | None = None  # math | coding; None: the registry entry's (sao.envs.registry.EnvEntry.domain)
    # episodes of this env in flight at once in this process, over every replica (each coding episode
    # holds a container); None: no bound beyond rollout.concurrency for math, and for coding what the
    # machine holds (sao.sandboxes.container_slots: 2 per core, 1 per 2 GB available)
    max_concurrent: int | None = None
    # merged over kwargs for the held-out evaluation (e.g. {split: test} while kwargs has split: train);
    # None: the env has no held-out split and sao-train does not evaluate it
    heldout_kwargs: dict[str, Any] | None = None


# The attention and MLP projections of Llama-style models (Llama, Qwen2, Mistral, SmolLM).
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    """Low-rank adapters through ``peft`` (:mod:`sao.rl.learner.lora`); ``rank`` 0 trains every weight.

    The policy trains only its adapters on ``target_modules``; the engine is sent the merged weights
    (base + the adapters' delta) under the plain names. ``critic``: the value model too takes
    adapters, on the MLP modules among ``target_modules`` only, with its norms and head trainable and
    everything else frozen (the frozen-attention critic in LoRA form); false: the critic trains in full.
    """

    rank: int = 0  # r; 0: off
    alpha: float = 16.0  # the adapters' scale is alpha / rank
    target_modules: list[str] = field(default_factory=lambda: list(LLAMA_PROJECTIONS))
    dropout: float = 0.0  # 0: the learner's log-probs match the engine's (no dropout at train time)
    critic: bool = False


@dataclass
class ModelConfig:
    """The policy: a local folder, a Hugging Face id, or an alias that ``sao-model prepare`` knows."""

    name: str = "smollm2-135m"
    dtype: str = "float32"  # the learner's master weights
    engine_dtype: str = "float32"  # what the engine serves and the weight sync writes (fp32: no update rounded away)
    # the learner's attention kernel: auto = eager under bf16 autocast on the CPU (torch's CPU flash
    # attention is 10x slower in bf16 backward there: benchmarks/learner_speed.py), sdpa otherwise
    attn_implementation: str = "auto"
    # recompute each decoder layer in the backward pass (sao.rl.learner.activation_recompute): "auto" turns it on when
    # a trajectory may exceed 1,024 tokens (engine.max_model_len > 1024 and env.max_tokens > 512 or null: the
    # coding envs), where activations, not weights, fill the memory; true / false force it
    activation_checkpointing: Any = "auto"
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class EngineConfig:
    """The inference engine. ``base_url`` None starts a managed local vLLM (killed at exit); otherwise
    an already running vLLM started with ``VLLM_SERVER_DEV_MODE=1`` (weight reloads) whose
    filesystem this process shares (the sync writes checkpoints it must read)."""

    base_url: str | None = None
    served_name: str | None = None  # the name in requests; None: model.name
    max_model_len: int = 2048
    # managed CPU engines' scheduling priority (0-19): on a small machine an engine decoding beside the learner
    # takes its fair share of the cores from the update (2 cores, 2 replicas: the update ran 2-3x slower);
    # a positive nice leaves the learner the CPU while it computes
    nice: int = 0
    kv_cache_gib: int = 2  # CPU KV cache
    startup_timeout_s: float = 600.0
    extra_args: list[str] = field(default_factory=list)
    request_timeout_s: float = 600.0
    probe: bool = True  # after a sync, compare engine and learner log-probs on a fixed sequence
    # ... after the first sync, every `probe_every` steps and the last one (3.3 s a step of the default run; in
    # rollout=sync, `rollout/logprob_gap` checks the freshly synced weights at every step anyway)
    probe_every: int = 4
    probe_warn_gap: float = 0.05  # warn when engine and learner log-probs differ more after a sync
    action_probes: int = 2  # trajectories of the batch just trained on whose sampled tokens are probed too
    keep_weight_versions: int = 2
    # Scheduled modes: a replica is dead when its process exits or /health fails `health_failures`
    # checks in a row (one every `health_interval_s`); a managed one is then restarted (at most
    # `max_restarts` times per replica), its in-flight trajectories re-queued or recorded failed.
    health_interval_s: float = 5.0
    health_failures: int = 3
    max_restarts: int = 3
    # Speculative decoding on managed engines (sao.agents.engine.speculative): none | suffix (SuffixDecoding,
    # METHOD.md 3). spec_tokens: most draft tokens a step (null: vLLM's default, 24 for suffix).
    speculative: str = "none"
    spec_tokens: int | None = None
    # load-aware: [[first, last, draft tokens], ...] by requests scheduled per step (vLLM's per-batch-size
    # schedule; benchmarks/war.py prints a calibrated one); null: always spec_tokens
    spec_schedule: list[list[int]] | None = None
    # sample through vLLM's token route (POST /inference/v1/generate; managed engines get --enable-scale-out):
    # each token's policy version (Completion.token_versions), so a turn a sync landed in counts the
    # versions that really sampled it. null: on for managed engines in the scheduled modes (where a sync
    # lands under running turns), off for rollout=sync (no turn spans a sync) and for external engines,
    # which need --enable-scale-out themselves (resolve_defaults).
    token_route: bool | None = None

    def __post_init__(self) -> None:
        spec = self.speculative_config()  # validates the method and spec_tokens
        if spec.enabled and "--speculative-config" in self.extra_args:
            raise ValueError(f"engine.speculative={self.speculative} and the --speculative-config in "
                             "engine.extra_args conflict; set one of them")

    def speculative_config(self) -> SpeculativeConfig:
        return SpeculativeConfig(method=self.speculative, num_tokens=self.spec_tokens,
                                 schedule=check_schedule(self.spec_schedule))


@dataclass
class RolloutConfig:
    """How trajectories are produced. ``sync`` runs one batch at a time (rl/rollout/sources.py); the other
    modes run a scheduler of :mod:`sao.rl.rollout.schedulers` over ``replicas`` engines (rl/rollout/orchestrated.py)."""

    mode: str = "sync"  # sync | one_step_off | async | multi_version | pipe
    concurrency: int = 32  # episodes in flight (per replica for the scheduled modes)
    temperature: float = 1.0
    top_p: float = 1.0
    replicas: int = 1  # managed engine replicas for the scheduled modes
    staleness: int = 4  # k: learner version - oldest version of a trained trajectory (async, multi_version)
    # async: drop (re-queue a too-stale trajectory's prompt) | mask (train it; DIS masks its off-policy
    # tokens). Neither keeps both of DORA's constraints; multi_version does. sao-sim paper_like, k = 4,
    # 256 engines: drop trained mean 1,325 action tokens vs 2,384 generated (every one of 1,167 drops
    # above the median: C2 broken) and 5,790 trained tokens/s; mask trained mean 2,370 (-1.4%) and
    # 10,287 tokens/s, but a third of its trajectories were older than k, up to 27 versions (C3
    # broken). drop stays the default because staleness <= k is the bound `staleness` promises and
    # the run's checks assert; rollout/len_trained_bias shows what it costs (sao.rl.rollout.schedulers.lengths).
    stale_policy: str = "drop"
    max_failures: int = 3  # failed attempts of a request before it is recorded failed
    async_outstanding: float | None = None  # async: batches in flight or finished-untrained (null: k + 1)
    # multi_version admission: 0 = METHOD.md 2's rule, new trajectories start only on replicas at the
    # newest version (old ones finish their in-flight work, then upgrade); N (1..k) = the lagged option,
    # overflow also starts on replicas up to N versions behind. sao-sim paper_like, k = 4, N = 2: equal
    # throughput at 32 and 256 replicas, 5% fewer trajectories/h at 8, but 31-35% more at 2-4 replicas
    # (draining replicas idle there; 29-60% of starts were then on old versions, mean staleness 1.6-1.8
    # vs 0.5-0.8). Few replicas: consider admit_lag=2.
    admit_lag: int = 0
    drain_below: float = 0.25  # multi_version with admit_lag > 0: an old replica this loaded (fraction of concurrency) drains
    # multi_version: move running requests between replicas of one old version so a draining replica with
    # at most drain_below x concurrency left empties and upgrades at once (DORA's rebalancing). On vLLM the
    # source is paused with mode "abort" and each request goes on on its new replica from the tokens it had
    # (sao.rl.rollout.moves); other modes refuse it. sao-sim paper_like, k = 4, at 64 and 256 replicas:
    # draining replica-time cut 2.4-6.6x, trained tokens/s 0.93-0.98x of admit_lag=0
    # (docs/results/dora-rebalancing.md).
    rebalance: bool = False
    # A new version loaded into a replica with requests in flight (async, pipe): False (the default)
    # clears vLLM's KV cache, so every request in flight computes its context again on the new weights
    # before its next token (exact, but the cost grows with the tokens in flight); True keeps their
    # old-weights KV (PipelineRL's in-flight updates). benchmarks/interruption.py, 16 requests x 192
    # tokens, an update every 8 s: 0.51x of no updates when cleared, 0.91x when kept (sao.rl.weights.load).
    keep_kv: bool = False
    micro_groups: int = 1  # pipe: complete groups per part handed to the learner (CGP)
    frontier_first: bool = True  # pipe: admit the frontier group's requests first (FGD)


@dataclass
class TensorBoardConfig:
    """``logger=[tensorboard]``: event files (sao.rl.training.trackers.tensorboard)."""

    log_dir: str | None = None  # null: RUN_DIR/tensorboard


@dataclass
class WandbConfig:
    """``logger=[wandb]``: a Weights & Biases run (sao.rl.training.trackers.wandb; the ``wandb`` extra).
    Offline without an account: ``WANDB_MODE=offline`` (or ``logger.wandb.mode=offline``)."""

    project: str = "sao"  # the W&B project
    entity: str | None = None  # null: the account's default entity
    group: str | None = None  # runs of one sweep side by side
    tags: list[str] = field(default_factory=list)  # the run's W&B tags
    mode: str | None = None  # online | offline | disabled; null: WANDB_MODE, else wandb's default (online)
    dir: str | None = None  # null: WANDB_DIR, else RUN_DIR (wandb writes DIR/wandb/)
    samples: int = 16  # held-out episodes in the table logged at each evaluation


@dataclass
class MlflowConfig:
    """``logger=[mlflow]``: an MLflow run (sao.rl.training.trackers.mlflow; the ``mlflow`` extra)."""

    # null: MLFLOW_TRACKING_URI, else a store inside the run (sqlite:///RUN_DIR/mlflow.db)
    tracking_uri: str | None = None
    experiment: str = "sao"  # the MLflow experiment (made when the store lacks it)


@dataclass
class LoggerConfig:
    """What a run logs. The trackers are the options of the Hydra group ``logger``, several at once
    (``logger=[tensorboard,wandb,mlflow]``; ``logger=[]``: none): a selected tracker's node is set, the
    others are None. ``logger=quiet`` turns the console off (and selects no tracker)."""

    jsonl: bool = True  # DIR/metrics.jsonl (always written when true; the contract's file)
    console: bool = True  # rich progress and one line per step
    save_trajectories: bool = True  # DIR/trajectories.jsonl, every episode as it finishes
    name: str | None = None  # the trackers' run name; null: the run folder's name
    tensorboard: TensorBoardConfig | None = None  # set by logger=[tensorboard] (the default): event files
    wandb: WandbConfig | None = None  # set by logger=[wandb]: a W&B run (the wandb extra)
    mlflow: MlflowConfig | None = None  # set by logger=[mlflow]: an MLflow run (the mlflow extra)


@dataclass
class ScheduleConfig:
    """How the task distribution changes during training (module doc). Hydra-structured: plain types.

    Each entry of ``phases`` is a dict with the keys of :class:`Phase`: ``families`` (required),
    ``weights``, ``difficulty``, ``steps`` (kind ``phases``: the phase's length; the last may omit
    it), ``advance_at``, ``min_steps``, ``window`` (kind ``reward_gated``: the gate; the last phase
    needs none). Keys a phase omits take the top-level defaults below.
    """

    kind: str = "none"  # none | phases | drift | reward_gated
    phases: list[dict[str, Any]] = field(default_factory=list)  # phases, reward_gated
    families: list[str] = field(default_factory=lambda: ["add", "sub", "mul", "div"])  # drift: the families drawn
    weights: list[float] | None = None  # drift: relative weight per family; None: uniform
    difficulty: float = 0.0  # phases, reward_gated: a phase's difficulty when it sets none
    start_difficulty: float = 0.0  # drift: difficulty at step 0 ...
    end_difficulty: float = 1.0  # ... and at step over_steps and after
    over_steps: int = 100
    window: int = 32  # reward_gated default: trajectories in the gate's reward window
    min_steps: int = 0  # reward_gated default: steps a phase lasts at least
    eval_every: int = 0  # steps between probes of every family seen so far (forgetting); 0: never
    eval_prompts: int = 8  # prompts per family in a probe (the same fixed set each time)


@dataclass
class EvalConfig:
    """Held-out evaluation during training (:mod:`sao.rl.training.heldout`): before the first step, every
    ``every`` steps (0: only before and after) and after the last. ``problems`` tasks of the
    training environment built with ``env.heldout_kwargs`` merged over ``env.kwargs`` (an env
    without ``heldout_kwargs`` has no held-out split, and is not evaluated), one episode each at
    ``temperature`` (0: greedy), ``max_tokens`` generated tokens at most (null: env.max_tokens)."""

    enabled: bool = True
    every: int = 12
    problems: int = 200
    temperature: float = 0.0
    max_tokens: int | None = None
    concurrency: int = 64
    # stop rule: once held-out accuracy has risen above its first evaluation, stop when it has not risen above its
    # best for this many evaluations in a row
    # (0: off, run to max_steps). On: the best evaluated policy is kept in RUN_DIR/best_model (a Hugging Face
    # folder that model.name= takes) and the curve in RUN_DIR/curve.json (sao.rl.training.early_stop)
    patience: int = 0
    # with patience: an evaluation above this accuracy also stops the run, and is never the best kept (a warm
    # start stops before it leaves the learnable band at the top, where RL would have nothing left to learn); null: off
    stop_above: float | None = None


@dataclass
class WarmStartConfig:
    """``warm_start=demonstrations``: before the run, a warm start from demonstrations (``algo=sft`` with
    ``algo.demonstrator``'s episodes and its stop rule) in ``RUN_DIR/warm_start``; the run then starts from
    its best model (:mod:`sao.rl.training.phases`). The warm start shares the run's env, model, engine, eval
    problems, seed and loggers; these are its own."""

    max_steps: int = 16  # SFT steps at most (the step budget)
    batch_size: int = 8  # demonstrations per step (fresh ones each step: max_steps x batch_size at most)
    lr: float = 1.0e-4
    eval_every: int = 1  # steps between its held-out evaluations (step 0 is evaluated too)
    patience: int = 2  # stop after this many evaluations without a new best, once risen (eval.patience)
    stop_above: float | None = 0.8  # ... or at an evaluation above the learnable band (eval.stop_above); null: off
    demonstrator: str = "arithmetic_tool"  # sao.rl.warm_start.DEMONSTRATORS
    min_reward: float = 1.0  # only demonstrations rewarded at least this are trained on

    def __post_init__(self) -> None:
        if min(self.max_steps, self.batch_size, self.eval_every, self.patience) < 1 or not self.lr > 0:
            raise ValueError("warm_start.max_steps, batch_size, eval_every and patience must be >= 1 and "
                             f"warm_start.lr > 0, got {self}")


SHARDINGS = ("replicate", "fsdp2")  # learner.sharding; the classes: sao.rl.learner.sharding.STRATEGIES


@dataclass
class LearnerRanksConfig:
    """The learner's processes (sao.rl.learner.parallel.ranks): ``world_size`` data-parallel ranks on this machine,
    each training on its share of every batch (gloo on CPU, NCCL on GPUs: one GPU a rank)."""

    world_size: int = 1
    backend: str = "auto"  # auto | gloo | nccl
    # torch threads of each rank; null: the machine's cores / world_size (ranks share the cores)
    threads: int | None = None
    # how the models are laid out over the ranks (sao.rl.learner.sharding): replicate (every rank holds the
    # whole model, gradients all-reduced) | fsdp2 (FSDP2 shards, world_size >= 2; a seam so far:
    # sao-train refuses it, and the module doc says what is missing)
    sharding: str = "replicate"

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"learner.world_size must be >= 1, got {self.world_size}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"unknown learner.sharding {self.sharding!r}"
                             + did_you_mean(self.sharding, SHARDINGS, clause=True)
                             + f" (known: {', '.join(SHARDINGS)})")
        if self.sharding == "fsdp2" and self.world_size < 2:
            raise ValueError("learner.sharding=fsdp2 splits each parameter over the data-parallel ranks and needs "
                             f"learner.world_size >= 2 (got {self.world_size}): with one rank the shard is the "
                             "whole model and nothing is saved; set learner.world_size=N or learner.sharding=replicate")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"learner.backend={self.backend!r}: known auto, gloo, nccl")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"learner.threads must be >= 1, got {self.threads}")


@dataclass
class RayResources:
    """What one Ray actor asks of its node: CPUs, GPUs, and custom resources (``{node1: 1}`` pins it
    to nodes started with ``ray start --resources '{"node1": 4}'``)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        """``ray.remote(...).options(**...)`` / a placement-group bundle's keyword form."""
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": dict(self.resources)}

    def bundle(self) -> dict[str, float]:
        """A placement-group bundle (its resource names as Ray spells them)."""
        out = {"CPU": float(self.num_cpus), **{k: float(v) for k, v in self.resources.items()}}
        if self.num_gpus:
            out["GPU"] = float(self.num_gpus)
        return {k: v for k, v in out.items() if v > 0}


PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
WEIGHT_TRANSPORTS = ("object_store", "shared_dir")


@dataclass
class ClusterConfig:
    """Where the run's processes live (``conf/cluster``): ``local`` (this machine: engines as
    subprocesses, learner ranks spawned here) or ``ray`` (:mod:`sao.rl.cluster.connection`: an existing Ray
    cluster at ``address``; each engine replica a Ray actor placed through a placement group of
    ``placement`` strategy with ``engine`` resources a replica, learner ranks 1..N-1 Ray actors with
    ``learner`` resources). ``weights``: how replicas on other nodes get each version:
    ``object_store`` (the version's files through Ray's object store into a node-local folder under
    ``node_dir``) or ``shared_dir`` (the run folder lies under ``shared_dir``, a filesystem every node
    mounts at the same path: the replicas read it directly)."""

    kind: str = "local"  # local | ray
    address: str = "auto"  # ray.init(address=...): auto, or HOST:PORT of the head's GCS
    namespace: str = "sao"
    placement: str = "SPREAD"  # the replicas' placement group: PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    engine: RayResources = field(default_factory=RayResources)  # each engine replica's actor
    learner: RayResources = field(default_factory=RayResources)  # each learner rank 1..N-1
    weights: str = "object_store"  # object_store | shared_dir
    shared_dir: str | None = None  # weights=shared_dir: the shared mount the run folder lies under
    node_dir: str | None = None  # a replica's folder on its node (model, versions, vLLM log); null: TMPDIR/sao-ray
    ping_s: float = 1.0  # seconds between the driver's liveness pings of each replica actor
    placement_timeout_s: float = 300.0  # how long to wait for the cluster to hold a placement group or rank

    def __post_init__(self) -> None:
        if self.kind not in ("local", "ray"):
            raise ValueError(f"cluster.kind={self.kind!r}: known local, ray (cluster=local|ray)")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"cluster.placement={self.placement!r}: known {', '.join(PLACEMENTS)}")
        if self.weights not in WEIGHT_TRANSPORTS:
            raise ValueError(f"cluster.weights={self.weights!r}: known {', '.join(WEIGHT_TRANSPORTS)}")
        if self.weights == "shared_dir" and not self.shared_dir:
            raise ValueError("cluster.weights=shared_dir needs cluster.shared_dir: the folder every node mounts "
                             "at the same path, which output_dir lies under")
        for name in ("engine", "learner"):
            r = getattr(self, name)
            if r.num_cpus < 0 or r.num_gpus < 0 or any(v < 0 for v in r.resources.values()):
                raise ValueError(f"cluster.{name}: resources must be >= 0, got {r}")
        if self.ping_s <= 0 or self.placement_timeout_s <= 0:
            raise ValueError("cluster.ping_s and cluster.placement_timeout_s must be > 0")


@dataclass
class AgentRunConfig:
    """How an agent plug-in's episodes run (``agent=NAME``, sao.agents.external.training): each in its own
    subprocess for at most ``timeout_s``, asked to make at most ``steps`` model calls (None: its own limit)."""

    timeout_s: float = 600.0
    steps: int | None = None


@dataclass
class TrainConfig:
    max_steps: int = 16  # policy steps, each followed by a weight sync
    output_dir: str | None = None  # None: Hydra's run folder
    seed: int = 0
    batch_size: int = 8  # trajectories per policy step (prompts x group_size)
    value_pretrain_steps: int = 2  # critic-only batches before the first policy step (critic algorithms)
    resume: bool = False
    checkpoint_every: int = 5  # steps between resumable checkpoints (the last step is always saved)
    keep_checkpoints: int = 2
    device: str = "auto"  # auto: cuda when present, else cpu
    # the algorithm's own config (ALGO_CONFIGS); the Hydra schema holds the base, which algo=NAME makes NAME's
    algo: AlgoConfig = field(default_factory=SAOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    learner: LearnerRanksConfig = field(default_factory=LearnerRanksConfig)  # data-parallel ranks
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)  # online learning: the task distribution
    eval: EvalConfig = field(default_factory=EvalConfig)  # held-out accuracy before, during and after
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # local | ray (scale-out)
    # who plays the episodes: llm (the project's agent loop) or an agent plug-in of the sao.agents entry points
    # (an unchanged external agent behind the capture proxy, sao.agents.external.training)
    agent: str = "llm"
    agent_run: AgentRunConfig = field(default_factory=AgentRunConfig)
    # warm_start=demonstrations: an SFT warm start before this run, which then starts from its best model
    warm_start: WarmStartConfig | None = None


def engine_urls(base_url: str | None) -> list[str]:
    """The external engines' root URLs in ``engine.base_url`` (comma-separated; ``/v1`` dropped)."""
    return [u.strip().rstrip("/").removesuffix("/v1") for u in (base_url or "").split(",") if u.strip()]


def scheduler_config(cfg: TrainConfig) -> Any:
    """The :class:`sao.rl.rollout.schedulers.SchedulerConfig` of a scheduled rollout mode (its checks raise here)."""
    from sao.rl.rollout.schedulers import SchedulerConfig

    r = cfg.rollout
    if r.rebalance and r.mode != "multi_version":
        raise ConfigError(f"rollout.rebalance=true moves running requests between replicas of one old version, "
                          f"which only rollout=multi_version keeps serving side by side (rollout={r.mode} has "
                          "none to move); set rollout.rebalance=false or rollout=multi_version")
    try:
        return SchedulerConfig(batch_size=cfg.batch_size, group_size=cfg.algo.group_size, max_concurrency=r.concurrency,
                               staleness=r.staleness, stale_policy=r.stale_policy, max_failures=r.max_failures,
                               micro_groups=r.micro_groups, frontier_first=r.frontier_first,
                               async_outstanding=r.async_outstanding, admit_lag=r.admit_lag, drain_below=r.drain_below,
                               rebalance=r.rebalance)
    except ConfigError as exc:
        raise ConfigError(f"rollout: {exc}") from exc


DIS_BANDS = {"math": (0.3, 5.0), "coding": (0.8, 3.0)}
"""SAO's DIS band (eps_low, eps_high) per domain (METHOD.md 1.8)."""
PPO_CLIP = (0.2, 0.28)  # clip-higher (DAPO)


def resolve_defaults(cfg: TrainConfig) -> TrainConfig:
    """Fill what the config leaves to the environment: ``env.domain`` from the registry, then the
    loss's band (``algo.eps_low`` / ``eps_high``) where it is None, a coding env's container
    bound (``env.max_concurrent``), and ``engine.token_route``. Returns ``cfg`` (changed in
    place), so that the run folder's config.json holds the values the run used."""
    from sao.envs.errors import UnknownEnvError
    from sao.envs.registry import resolve

    if cfg.env.domain is None:
        try:
            cfg.env.domain = resolve(cfg.env.name).domain
        except UnknownEnvError as exc:
            raise ConfigError(str(exc)) from exc
    if cfg.env.domain not in DIS_BANDS:
        raise ConfigError(f"env.domain must be one of {', '.join(DIS_BANDS)}, got {cfg.env.domain!r}")
    if cfg.env.max_concurrent is None and cfg.env.domain == "coding":
        from sao.sandboxes import container_slots

        cfg.env.max_concurrent = container_slots()
    if cfg.engine.token_route is None:
        cfg.engine.token_route = cfg.rollout.mode != "sync" and not cfg.engine.base_url
    if cfg.algo.loss == SFT_LOSS:  # no importance ratio, no band
        return cfg
    low, high = {"dis": DIS_BANDS[cfg.env.domain], "ppo": PPO_CLIP}[cfg.algo.loss]
    cfg.algo.eps_low = low if cfg.algo.eps_low is None else cfg.algo.eps_low
    cfg.algo.eps_high = high if cfg.algo.eps_high is None else cfg.algo.eps_high
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Cross-field checks that a schema cannot express. Raises :class:`ConfigError`."""
    for name in ("max_steps", "batch_size", "checkpoint_every", "keep_checkpoints"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.value_pretrain_steps < 0:
        raise ConfigError(f"value_pretrain_steps must be >= 0, got {cfg.value_pretrain_steps}")
    if cfg.engine.probe_every < 1:
        raise ConfigError(f"engine.probe_every must be >= 1, got {cfg.engine.probe_every}")
    g = cfg.algo.group_size
    if g < 1 or cfg.batch_size % g:
        raise ConfigError(f"batch_size ({cfg.batch_size}) must be a positive multiple of algo.group_size ({g})")
    if cfg.env.max_concurrent is not None and cfg.env.max_concurrent < 1:
        raise ConfigError(f"env.max_concurrent must be >= 1, got {cfg.env.max_concurrent}")
    if cfg.rollout.concurrency < 1:
        raise ConfigError(f"rollout.concurrency must be >= 1, got {cfg.rollout.concurrency}")
    from sao.rl.rollout.schedulers import MODES
    from sao.rl.rollout.schedulers.core import unknown_name

    if cfg.rollout.mode not in MODES:
        raise ConfigError(str(unknown_name("rollout", cfg.rollout.mode, tuple(MODES))))
    if cfg.rollout.mode in ("async", "multi_version") and cfg.algo.group_size != 1:
        raise ConfigError(f"rollout={cfg.rollout.mode} streams single rollouts (SAO); algo.group_size must be 1, "
                          f"not {cfg.algo.group_size} (GRPO groups: rollout=pipe or sync)")
    if cfg.rollout.mode == "pipe" and cfg.algo.group_size < 2:
        raise ConfigError("rollout=pipe pipelines complete GRPO groups: algo.group_size must be >= 2")
    if cfg.rollout.replicas < 1:
        raise ConfigError(f"rollout.replicas must be >= 1, got {cfg.rollout.replicas}")
    urls = engine_urls(cfg.engine.base_url)
    if urls and cfg.rollout.replicas not in (1, len(urls)):
        raise ConfigError(f"engine.base_url names {len(urls)} engine(s), rollout.replicas is {cfg.rollout.replicas}: "
                          "external engines are the replicas (leave rollout.replicas at 1 or match the count)")
    if len(urls) > 1 and cfg.rollout.mode == "sync":
        raise ConfigError("rollout=sync drives one engine; several engine.base_url URLs need a scheduled rollout mode")
    if cfg.engine.health_interval_s <= 0 or cfg.engine.health_failures < 1 or cfg.engine.max_restarts < 0:
        raise ConfigError("engine.health_interval_s must be > 0, engine.health_failures >= 1, engine.max_restarts >= 0")
    if cfg.env.max_turns < 1 or (cfg.env.max_tokens is not None and cfg.env.max_tokens < 1):
        raise ConfigError("env.max_turns and env.max_tokens must be >= 1 (env.max_tokens null: no budget)")
    if cfg.env.max_tokens is not None and cfg.env.max_tokens >= cfg.engine.max_model_len:
        raise ConfigError(f"env.max_tokens ({cfg.env.max_tokens}) must be below engine.max_model_len "
                          f"({cfg.engine.max_model_len}), which also holds the prompt")
    if cfg.eval.enabled and (cfg.eval.every < 0 or cfg.eval.problems < 1 or cfg.eval.concurrency < 1
                             or cfg.eval.patience < 0):
        raise ConfigError("eval.every and eval.patience must be >= 0, eval.problems and eval.concurrency >= 1")
    if cfg.eval.patience and not (cfg.eval.enabled and cfg.eval.every > 0 and cfg.env.heldout_kwargs is not None):
        raise ConfigError("eval.patience stops on held-out accuracy: it needs eval.enabled=true, eval.every > 0 "
                          "and an env with a held-out split (env.heldout_kwargs)")
    if cfg.algo.loss == SFT_LOSS and cfg.rollout.mode != "sync":
        raise ConfigError(f"algo=sft learns from demonstrations, with one engine for its held-out evaluation: "
                          f"use rollout=sync, not rollout={cfg.rollout.mode}")
    scheduler_config(cfg)
    if cfg.model.activation_checkpointing not in ("auto", True, False):
        raise ConfigError(f"model.activation_checkpointing must be auto, true or false, "
                          f"got {cfg.model.activation_checkpointing!r}")
    validate_lora(cfg.model.lora)
    validate_cluster(cfg)
    validate_agent(cfg)


def validate_agent(cfg: TrainConfig) -> None:
    """``agent``: the project's loop (``llm``) or an installed agent plug-in; the scripted agents have no
    model to train."""
    if cfg.agent == "llm":
        return
    if cfg.agent in ("gold", "empty"):
        raise ConfigError(f"agent={cfg.agent} is a scripted agent of sao-eval: it samples nothing to train on; "
                          "use agent=llm or an agent plug-in (sao.agents entry points)")
    from sao.agents.external.registry import find

    try:
        find(cfg.agent)
    except Exception as exc:  # noqa: BLE001 - the registry's own message says what is installed
        raise ConfigError(f"agent={cfg.agent}: {exc}") from exc
    if cfg.rollout.top_p != 1.0:
        raise ConfigError(f"agent={cfg.agent} samples through the capture proxy with top_p 1 (pinned, as the learner "
                          f"assumes); rollout.top_p={cfg.rollout.top_p} is not supported with an agent plug-in")
    if not cfg.agent_run.timeout_s > 0 or (cfg.agent_run.steps is not None and cfg.agent_run.steps < 1):
        raise ConfigError("agent_run.timeout_s must be > 0 and agent_run.steps >= 1 (null: the agent's own limit)")


def validate_cluster(cfg: TrainConfig) -> None:
    """``cluster=ray`` places the engine replicas itself: a scheduled rollout mode, no external engines."""
    if cfg.cluster.kind != "ray":
        return
    if cfg.rollout.mode == "sync":
        raise ConfigError("cluster=ray runs the engine replicas as Ray actors under a scheduled rollout mode; "
                          "set rollout=async (or one_step_off, multi_version, pipe)")
    if engine_urls(cfg.engine.base_url):
        raise ConfigError("cluster=ray starts its own engine replicas on the cluster; leave engine.base_url unset "
                          "(or use cluster=local with external engines)")


def activation_checkpointing(cfg: TrainConfig) -> bool:
    """Whether the learner checkpoints activations (``model.activation_checkpointing``)."""
    if cfg.model.activation_checkpointing == "auto":
        return (cfg.env.max_tokens is None or cfg.env.max_tokens > 512) and cfg.engine.max_model_len > 1024
    return bool(cfg.model.activation_checkpointing)


def validate_lora(lora: LoraConfig) -> None:
    """``model.lora``'s ranges. Raises :class:`ConfigError`."""
    if lora.rank < 0:
        raise ConfigError(f"model.lora.rank must be >= 0 (0: no LoRA), got {lora.rank}")
    if not lora.alpha > 0:
        raise ConfigError(f"model.lora.alpha must be > 0, got {lora.alpha}")
    if not 0.0 <= lora.dropout < 1.0:
        raise ConfigError(f"model.lora.dropout must be in [0, 1), got {lora.dropout}")
    if lora.rank and not lora.target_modules:
        raise ConfigError("model.lora.target_modules is empty; name the modules to adapt (e.g. q_proj, v_proj)")
    if lora.critic and not lora.rank:
        raise ConfigError("model.lora.critic=true needs model.lora.rank > 0 (the critic's adapters take that rank)")
