"""The learner's building blocks (METHOD.md 1): token log-probs, the critic step, the policy step.

The algorithms (``algo: sao | grpo | ppo``, :mod:`sao.rl.algos`) compose these pieces with their own
advantages and policy losses; nothing here branches on an algorithm name. Tensors follow the
token-aligned convention of :mod:`sao.rl.learner.batch`: column t of every [B, T] tensor is about token t, and
``token_logprobs`` does the one shift (the log-prob of token t comes from the logits at t - 1).

Micro-batching is exact: each micro-batch's loss is divided by the FULL batch's normalizer (for
``token-mean``: its total number of action tokens) and the gradients are summed, so one optimizer step
does not depend on ``token_budget`` (up to float rounding).
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sao.hints import did_you_mean
from sao.rl.learner.batch import Batch, micro_batches
from sao.rl.learner.batch_share import BatchShare
from sao.rl.learner.lr_schedule import LrSchedule
from sao.rl.learner.packing import packing_is_exact, trunk_hidden
from sao.rl.learner.parallel import DataParallel
from sao.rl.learner.value_model import ValueModel, backbone_of
from sao.rl.objectives import AGG_MODES, kl_estimates, value_loss

log = logging.getLogger(__name__)


@dataclass
class LearnerConfig:
    """Learner hyper-parameters; defaults are SAO's math setting (METHOD.md 1)."""

    lr: float = 1e-6
    value_lr: float | None = None  # None: 5 x lr (paper: 5e-6 vs 1e-6)
    value_warmup_steps: int = 10  # linear warm-up of the value optimizer's lr
    # the fresh scalar head's own lr (its 577 parameters start near 0 while the trunk is the policy's);
    # None: the value lr, one group for the whole value model
    value_head_lr: float | None = None
    # the head fitted in closed form on the frozen trunk (sao.rl.learner.ridge_head): the ridge penalty, and the
    # weight each batch's statistics keep per later batch; None: the critic trains by gradient
    value_head_ridge: float | None = None
    value_head_decay: float = 1.0
    # the policy's lr over its steps (sao.rl.learner.lr_schedule): constant, or linear | cosine decay from lr
    # to min_lr_ratio x lr at step decay_steps (the run's max_steps)
    lr_decay: str = "constant"
    decay_steps: int | None = None
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01  # open in the paper; AdamW's usual RL value
    grad_clip: float | None = 1.0  # max global grad norm per model; None: no clipping (norm still logged)
    token_budget: int | None = None  # padded tokens per micro-batch; None: the whole batch at once
    # The algorithm's own hyper-parameters (TTUR's k, gamma, lambda's alpha, the DIS band) live in its
    # typed config (sao.rl.algos), not here: the Learner only runs passes and optimizer steps.
    value_clip: float | None = 0.2  # None: plain MSE
    agg: str = "token-mean"
    agg_normalizer: float | None = None  # the constant for agg="token-sum-norm"
    bf16: bool = False  # bf16 autocast for the policy's passes (log-softmax stays fp32)
    # bf16 autocast for the value model's passes (its head stays fp32); None: as ``bf16``. The critic's
    # precision never enters the importance ratios, so it can be low where the policy's cannot.
    critic_bf16: bool | None = None
    freeze_value_attention: bool = True
    logprob_chunk: int = 1024  # positions per chunk of the vocab log-softmax
    # run each micro-batch's rows end to end, without padding (sao.rl.learner.packing): fewer positions and
    # few distinct shapes; ``token_budget`` then counts real tokens. Turned off (with a warning) for
    # a model whose packed and padded hidden states differ.
    pack: bool = True

    def __post_init__(self) -> None:
        if self.agg not in AGG_MODES:
            raise ValueError(f"unknown agg {self.agg!r} (known: {', '.join(AGG_MODES)})"
                             + did_you_mean(self.agg, AGG_MODES, clause=True))
        if self.agg == "token-sum-norm" and self.agg_normalizer is None:
            raise ValueError("agg='token-sum-norm' needs agg_normalizer (e.g. the maximum generation length)")
        if self.logprob_chunk < 1 or self.value_warmup_steps < 0:
            raise ValueError("logprob_chunk must be >= 1, value_warmup_steps >= 0")
        if self.value_head_lr is not None and not self.value_head_lr > 0:
            raise ValueError(f"value_head_lr must be > 0 or None, got {self.value_head_lr}")
        LrSchedule(self.lr_decay, self.decay_steps, self.min_lr_ratio)  # validates the schedule

    @property
    def lr_schedule(self) -> LrSchedule:
        return LrSchedule(self.lr_decay, self.decay_steps, self.min_lr_ratio)

    @property
    def critic_autocast(self) -> bool:
        return self.bf16 if self.critic_bf16 is None else self.critic_bf16

    @property
    def critic_lr(self) -> float:
        return 5.0 * self.lr if self.value_lr is None else self.value_lr


def adamw(params: Any, *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``params``, fused where torch has the fused kernel for their device (CPU and CUDA,
    floating point): one pass over each tensor instead of a dozen elementwise ops (the default
    ``foreach=False`` path on the CPU). Same update, to float rounding. ``params``: tensors, or
    parameter groups (dicts with ``params``)."""
    params = list(params)
    tensors = [t for g in params for t in (g["params"] if isinstance(g, dict) else [g])]
    devices = {p.device.type for p in tensors}
    fused = bool(tensors) and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in tensors)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def _autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def _chunk_logprobs(head: nn.Module, hidden: Tensor, targets: Tensor, bf16: bool) -> Tensor:
    """log softmax(head(hidden))[targets] for one chunk of positions: [B, C, H], [B, C] -> [B, C] fp32."""
    with _autocast(hidden.device, bf16):
        logits = head(hidden)
    logits = logits.float()
    return logits.gather(-1, targets[..., None]).squeeze(-1) - logits.logsumexp(-1)


def token_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, chunk: int = 1024, bf16: bool = False,
    only: Tensor | None = None, packed: bool = False,
) -> Tensor:
    """log pi(token_t | tokens_<t) for every token: [B, T] float32, token-aligned.

    ``out[:, t]`` comes from the logits at position t - 1; ``out[:, 0] = 0`` (no prefix) and padding is 0.
    ``only`` ([B, T] bool, e.g. the action mask): compute just those tokens' log-probs (0 elsewhere).
    The LM head over the 49k-entry vocabulary is a large share of a small model's compute, and the
    learner needs it at action tokens only, so their hidden states are gathered first (padding and
    prompt positions never reach the head). The head and the log-softmax run over ``chunk`` positions
    at a time; with gradients on, each chunk is recomputed in backward (activation checkpointing),
    so the [N, vocab] logits never exist at once. Assumes logits =
    ``model.get_output_embeddings()(last_hidden_state)`` (true for Llama, Qwen, Mistral, SmolLM;
    models with logit soft-capping or scaling need their own head function). ``packed``: the trunk
    runs on the rows laid end to end (:func:`sao.rl.learner.packing.packed_hidden`), same values.
    """
    with _autocast(input_ids.device, bf16):
        hidden = trunk_hidden(backbone_of(model), input_ids, attention_mask, packed)
    head_fn = partial(_chunk_logprobs, model.get_output_embeddings(), bf16=bf16)
    want = attention_mask.bool() if only is None else only.bool() & attention_mask.bool()
    want = torch.cat([torch.zeros_like(want[:, :1]), want[:, 1:]], dim=1)  # token 0 has no prefix
    # position t - 1 predicts token t: gather the predicting hidden states and the targets, packed
    h_all, y_all = hidden[:, :-1][want[:, 1:]], input_ids[:, 1:][want[:, 1:]]  # [N, H], [N]
    pieces = []
    for s in range(0, h_all.shape[0], chunk):
        h, y = h_all[None, s:s + chunk], y_all[None, s:s + chunk]
        pieces.append((checkpoint(head_fn, h, y, use_reentrant=False) if h.requires_grad else head_fn(h, y))[0])
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if pieces:
        out = out.masked_scatter(want, torch.cat(pieces))
    return out


class CriticTargets(Protocol):
    """``(micro-batch, values [b, T], last [b]) -> micro-batch with returns and old_values set``."""

    def __call__(self, mb: Batch, values: Tensor, last: Tensor) -> Batch: ...


class PolicyLoss(Protocol):
    """A policy loss over one micro-batch: ``(logp [B, T] with grad, micro-batch, agg, normalizer) ->
    (scalar loss, metrics)``. ``normalizer`` is the FULL batch's, so micro-batches sum exactly."""

    def __call__(self, logp: Tensor, mb: Batch, *, agg: str, normalizer: float) -> tuple[Tensor, dict[str, float]]: ...


@dataclass
class _PartialStep:
    """A policy step accumulated part by part: per-token-weighted metric sums, the summed loss, and
    the counts the whole batch's normalizer is made of."""

    sums: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    loss: float = 0.0
    micro_batches: int = 0
    action_tokens: int = 0
    rows: int = 0
    parts: int = 0


def _optimizers(cfg: LearnerConfig, policy: nn.Module, value_model: ValueModel | None,
                policy_optimizer: torch.optim.Optimizer | None, value_optimizer: torch.optim.Optimizer | None
                ) -> tuple[Any, Any, Any, Any]:
    """The policy's optimizer and lr schedule, and the value model's (None without one): AdamW unless
    given, the value one with a linear warm-up. Freezes the value model's attention when configured."""
    policy_optimizer = policy_optimizer or adamw(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    policy_scheduler = torch.optim.lr_scheduler.LambdaLR(policy_optimizer, cfg.lr_schedule.factor)
    if value_model is None:
        return policy_optimizer, policy_scheduler, None, None
    if cfg.freeze_value_attention:
        value_model.freeze_attention()
    # frozen parameters never get a .grad, so AdamW skips them (no update, no weight decay)
    value_optimizer = value_optimizer or adamw(_value_groups(cfg, value_model), lr=cfg.critic_lr,
                                               weight_decay=cfg.weight_decay)
    warmup = cfg.value_warmup_steps
    value_scheduler = torch.optim.lr_scheduler.LambdaLR(
        value_optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
    return policy_optimizer, policy_scheduler, value_optimizer, value_scheduler


def _value_groups(cfg: LearnerConfig, value_model: ValueModel) -> list[Any]:
    """The value model's parameters for its optimizer: one group, or with ``value_head_lr`` the trunk's at the
    value lr and the head's at its own (the warm-up scales both)."""
    if cfg.value_head_lr is None:
        return list(value_model.parameters())
    head = {id(p) for p in value_model.head.parameters()}
    trunk = [p for p in value_model.parameters() if id(p) not in head]
    return [{"params": trunk}, {"params": list(value_model.head.parameters()), "lr": cfg.value_head_lr}]


def _closed_form_head(cfg: LearnerConfig, value_model: ValueModel | None, data_parallel: DataParallel | None) -> None:
    """With ``value_head_ridge``: the value model's head fitted in closed form, its trunk frozen."""
    if cfg.value_head_ridge is None or value_model is None:
        return
    if data_parallel is not None:
        raise ValueError("a closed-form value head (value_head_ridge) runs on one learner rank; "
                         "set learner.world_size=1 or value_head_ridge=null")
    value_model.fit_head_in_closed_form(cfg.value_head_ridge, cfg.value_head_decay)


def _pad_to(x: Tensor, width: int) -> Tensor:
    return nn.functional.pad(x, (0, width - x.shape[1]))


class Learner:
    """Holds the policy (a Hugging Face causal LM), the optional value model and their optimizers.

    Building blocks: :meth:`policy_step` (any :class:`PolicyLoss`, also taken part by part),
    :meth:`value_step` (critic), :meth:`predict_values`; :mod:`sao.rl.algos` chains them.
    Optimizers default to AdamW (the value one with a linear warm-up); pass your own to override.
    Models are used in whatever train/eval mode the caller left them.
    """

    def __init__(
        self,
        policy: nn.Module,
        config: LearnerConfig | None = None,
        *,
        value_model: ValueModel | None = None,
        policy_optimizer: torch.optim.Optimizer | None = None,
        value_optimizer: torch.optim.Optimizer | None = None,
        data_parallel: DataParallel | None = None,
    ) -> None:
        self.config = cfg = config or LearnerConfig()
        self.policy, self.value_model = policy, value_model
        self._stream: _PartialStep | None = None  # a policy step being accumulated part by part
        self.device = next(policy.parameters()).device
        if cfg.pack and not packing_is_exact(backbone_of(policy), policy.config.vocab_size):
            log.warning("%s gives different hidden states for packed and padded rows; the learner pads "
                        "its micro-batches instead (slower)", type(policy).__name__)
            self.config = cfg = replace(cfg, pack=False)
        # one rank of a data-parallel learner (sao.rl.learner.parallel.data_parallel) is handed the whole batch
        # at every step, trains on this rank's rows and sums gradients and metrics over the ranks
        self.share = BatchShare(data_parallel, self.device, cfg.agg, cfg.agg_normalizer)
        _closed_form_head(cfg, value_model, data_parallel)
        self.policy_optimizer, self.policy_scheduler, self.value_optimizer, self.value_scheduler = _optimizers(
            cfg, policy, value_model, policy_optimizer, value_optimizer)

    def _value(self) -> ValueModel:
        if self.value_model is None:
            raise ValueError("this Learner has no value model; pass value_model=ValueModel.from_policy(policy)")
        return self.value_model

    # ---- value model -----------------------------------------------------------------------------

    @torch.no_grad()
    def predict_values(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The value model's current predictions, no gradient: (values [B, T] token-aligned, last [B]
        the value after each row's final token), as in :meth:`ValueModel.token_values`."""
        vm, cfg = self._value(), self.config
        batch = batch.to(self.device)
        local = self.share.local(batch)
        values, last = [], []
        for mb in micro_batches(local, cfg.token_budget, packed=cfg.pack):
            with _autocast(self.device, cfg.critic_autocast):
                v, v_last = vm.token_values(mb.input_ids, mb.attention_mask, cfg.pack)
            values.append(_pad_to(v.float(), batch.input_ids.shape[1]))
            last.append(v_last.float())
        return self.share.gather(values, last, batch)

    def value_step(self, batch: Batch) -> dict[str, float]:
        """One critic optimizer step on ``batch`` (clipped value loss at action tokens, METHOD.md 1.9).

        Fits ``batch.returns`` with ``batch.old_values`` as the clipping anchor; the algorithm sets both
        (e.g. :meth:`sao.rl.algos.SAO.with_critic_targets`, so K TTUR steps share one target and anchor)."""
        if batch.returns is None or batch.old_values is None:
            raise ValueError("value_step needs batch.returns and batch.old_values (the algorithm's critic targets)")
        return self._value_step(batch.to(self.device), None)[0]

    def first_value_step(self, batch: Batch, targets: CriticTargets) -> tuple[dict[str, float], tuple[Tensor, Tensor]]:
        """A critic step whose targets come from its own forward pass: each micro-batch's values (before
        the step, detached) go through ``targets(micro_batch, values, last)``, which returns the
        micro-batch with ``returns`` and ``old_values`` set, and the loss is taken against those.
        Returns the step's metrics and the values of the whole batch before the step, ``(values [B, T],
        last [B])`` as :meth:`predict_values` gives them: the first of K TTUR steps thereby replaces
        the separate no-gradient forward pass that computing the targets first would cost."""
        return self._value_step(batch.to(self.device), targets)

    def _value_step(self, batch: Batch, targets: CriticTargets | None
                    ) -> tuple[dict[str, float], tuple[Tensor, Tensor]]:
        vm, cfg = self._value(), self.config
        norm = self.share.normalizer(batch.action_mask)  # the whole batch's, on every rank
        self.value_optimizer.zero_grad(set_to_none=True)
        sums, loss_total, n_mb = defaultdict(float), 0.0, 0
        seen_values, seen_last = [], []
        local = self.share.local(batch)
        for mb in micro_batches(local, cfg.token_budget, packed=cfg.pack):
            with _autocast(self.device, cfg.critic_autocast):
                values, last = vm.token_values(mb.input_ids, mb.attention_mask, cfg.pack)
            values, last = values.float(), last.float()
            if targets is not None:
                mb = targets(mb, values.detach(), last.detach())
            seen_values.append(_pad_to(values.detach(), batch.input_ids.shape[1]))
            seen_last.append(last.detach())
            loss, m = value_loss(values, mb.old_values, mb.returns, mb.action_mask,
                                 clip=cfg.value_clip, agg=cfg.agg, normalizer=norm)
            loss.backward()
            loss_total += loss.item()
            n_mb += 1
            for k, v in m.items():
                sums[k] += v * mb.num_action_tokens
        trainable = [p for p in vm.parameters() if p.requires_grad]
        sums, loss_total, n_mb = self.share.reduce(trainable, sums, loss_total, n_mb)
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip or float("inf"))
        lrs = [g["lr"] for g in self.value_optimizer.param_groups]  # [trunk (all), head] with value_head_lr
        self.value_optimizer.step()
        self.value_optimizer.zero_grad(set_to_none=True)  # the critic's gradients never outlive its step
        self.value_scheduler.step()
        n = max(batch.num_action_tokens, 1)
        metrics = {**{k: v / n for k, v in sums.items()}, "loss/value": loss_total,
                   "grad_norm/value": float(grad_norm), "lr/value": lrs[0], "value/micro_batches": n_mb,
                   **({"lr/value_head": lrs[-1]} if len(lrs) > 1 else {})}
        return metrics, self.share.gather(seen_values, seen_last, batch)

    # ---- policy ----------------------------------------------------------------------------------

    def policy_step(self, batch: Batch, advantages: Tensor, loss_fn: PolicyLoss, apply: bool = True) -> dict[str, float]:
        """One policy optimizer step with ``loss_fn`` (any :class:`PolicyLoss`, e.g.
        :class:`sao.rl.algos.DISLoss` against ``batch.rollout_logprobs``); ``apply=False``: the same metrics,
        the gradients dropped, no optimizer or schedule step (``policy/stepped`` 0).

        advantages: [B, T], token-aligned. Gradients are accumulated exactly over micro-batches of
        ``config.token_budget`` tokens. Metrics: ``loss/policy``, ``dis/*``, ``grad_norm/policy``,
        ``rollout/logprob_gap`` (mean |logp_train - logp_rollout| over action tokens, measured before the
        step) and ``rollout/kl_k{1,2,3}`` (KL(pi_train || pi_rollout) estimates, same tokens).
        """
        batch = replace(batch.to(self.device), advantages=advantages.to(self.device))
        self.policy_optimizer.zero_grad(set_to_none=True)
        sums: defaultdict[str, float] = defaultdict(float)
        norm = self.share.normalizer(batch.action_mask)  # the whole batch's, on every rank
        loss_total, n_mb = self._policy_backward(self.share.local(batch), loss_fn, norm, sums)
        sums, loss_total, n_mb = self.share.reduce(self.policy.parameters(), sums, loss_total, n_mb)
        return _policy_apply(self, sums, loss_total, n_mb, batch.num_action_tokens, apply)

    # ---- a policy step over micro-batches that arrive one by one (RolloutPipe's CGP) -------------

    def begin_policy_step(self) -> None:
        """Start a policy step whose batch arrives in parts (:meth:`accumulate_policy`, then
        :meth:`finish_policy_step`). The gradient is exact: each part's loss is summed with
        normalizer 1 and the sum is divided by the whole batch's normalizer at the end -- every
        aggregation is (sum of per-token terms) / a batch-level scalar (sao.rl.objectives.losses), so this
        equals :meth:`policy_step` on the concatenated batch up to float rounding."""
        self.policy_optimizer.zero_grad(set_to_none=True)
        self._stream = _PartialStep()

    def accumulate_policy(self, batch: Batch, advantages: Tensor, loss_fn: PolicyLoss) -> None:
        """Backward one part of the step's batch (its gradients add up in the parameters)."""
        st = self._stream
        if st is None:
            raise RuntimeError("accumulate_policy before begin_policy_step")
        batch = replace(batch.to(self.device), advantages=advantages.to(self.device))
        loss, n_mb = self._policy_backward(self.share.local(batch), loss_fn, 1.0, st.sums)
        st.loss += loss
        st.micro_batches += n_mb
        st.action_tokens += batch.num_action_tokens
        st.rows += int((batch.action_mask.sum(-1) > 0).sum())
        st.parts += 1

    def finish_policy_step(self) -> dict[str, float]:
        """Divide the accumulated gradients by the whole batch's normalizer and take the step."""
        st = self._stream
        if st is None or st.parts == 0:
            raise RuntimeError("finish_policy_step needs begin_policy_step and at least one accumulate_policy")
        self._stream = None
        st.sums, st.loss, st.micro_batches = self.share.reduce(self.policy.parameters(), st.sums, st.loss, st.micro_batches)
        norm = self.share.normalizer_of(st.action_tokens, st.rows)
        for param in self.policy.parameters():
            if param.grad is not None:
                param.grad.div_(norm)
        metrics = _policy_apply(self, st.sums, st.loss / norm, st.micro_batches, st.action_tokens)
        return {**metrics, "policy/parts": float(st.parts)}

    def _policy_backward(self, batch: Batch, loss_fn: PolicyLoss, norm: float,
                         sums: defaultdict[str, float]) -> tuple[float, int]:
        """Forward and backward every micro-batch of ``batch`` with the loss divided by ``norm``;
        per-token-weighted metrics added to ``sums``. Returns (summed loss, micro-batches)."""
        cfg = self.config
        loss_total, n_mb = 0.0, 0
        for mb in micro_batches(batch, cfg.token_budget, packed=cfg.pack):
            logp = token_logprobs(self.policy, mb.input_ids, mb.attention_mask, chunk=cfg.logprob_chunk, bf16=cfg.bf16,
                                  only=mb.action_mask, packed=cfg.pack)
            loss, m = loss_fn(logp, mb, agg=cfg.agg, normalizer=norm)
            loss.backward()
            loss_total += loss.item()
            n_mb += 1
            with torch.no_grad():
                act = mb.action_mask.bool()
                gap = torch.where(act, (logp - mb.rollout_logprobs).abs(), 0.0).sum() / act.sum().clamp(min=1)
                kl = kl_estimates(logp, mb.rollout_logprobs, act)
            m |= {"rollout/logprob_gap": gap.item(), **{f"rollout/kl_{k[3:]}": v for k, v in kl.items()}}
            for k, v in m.items():
                sums[k] += v * mb.num_action_tokens
        return loss_total, n_mb


def _policy_apply(learner: Learner, sums: dict[str, float], loss_total: float, n_mb: int, tokens: int,
                  apply: bool = True) -> dict[str, float]:
    """Clip, step (unless not ``apply``), and the step's metrics (token-weighted means of the micro-batch
    metrics)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(learner.policy.parameters(), learner.config.grad_clip or float("inf"))
    lr = learner.policy_optimizer.param_groups[0]["lr"]
    if apply:
        learner.policy_optimizer.step()
        learner.policy_scheduler.step()
    learner.policy_optimizer.zero_grad(set_to_none=True)  # 4 bytes a parameter, not held while the critic trains
    n = max(tokens, 1)
    return {**{k: v / n for k, v in sums.items()}, "loss/policy": loss_total, "optim/lr": lr,
            "grad_norm/policy": float(grad_norm), "policy/micro_batches": n_mb,
            "policy/action_tokens": tokens, "policy/stepped": float(apply)}
