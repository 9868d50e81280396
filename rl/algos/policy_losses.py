"""The policy losses the algorithms plug into :meth:`~sao.rl.learner.learner.Learner.policy_step`: small
frozen callables (:class:`~sao.rl.learner.learner.PolicyLoss`) over one micro-batch, each holding its own knobs.

The PPO loss is taken on-policy with ONE optimizer step per batch (``max_steps`` counts policy steps,
each followed by a weight sync), so the "old" policy of its ratio is the learner's own policy at the
start of the step: ``logp.detach()`` of the same forward pass, no second pass needed. The gap to
what the engine sampled with (``batch.rollout_logprobs``) is corrected, as an option, with truncated
or masked (IcePop) importance sampling; DIS instead uses the rollout log-probs directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from sao.rl.config import AlgoConfig
from sao.rl.errors import ConfigError
from sao.rl.learner import Batch, PolicyLoss
from sao.rl.objectives import dis_policy_loss, masked_is_weights, ppo_clip_loss, truncated_is_weights


@dataclass(frozen=True)
class DISLoss:
    """SAO's DIS: zero gradient outside ``(1 - eps_low, 1 + eps_high)``, both sides (METHOD.md 1.8)."""

    eps_low: float = 0.3
    eps_high: float = 5.0

    def __call__(self, logp: Tensor, mb: Batch, *, agg: str, normalizer: float) -> tuple[Tensor, dict[str, float]]:
        return dis_policy_loss(logp, mb.rollout_logprobs, mb.advantages, mb.action_mask, eps_low=self.eps_low,
                               eps_high=self.eps_high, agg=agg, normalizer=normalizer)


@dataclass(frozen=True)
class PPOClipLoss:
    """PPO's clip with clip-higher (0.2 / 0.28) and optional dual-clip, on-policy (module doc), with
    an optional rollout correction: ``tis`` weights ``min(pi_old / pi_rollout, cap)``, ``icepop``
    zeroes tokens whose ratio leaves ``[low, high]``."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip_c: float | None = None
    is_correction: str = "none"
    is_cap: float = 2.0
    icepop_low: float = 0.5
    icepop_high: float = 2.0

    def __post_init__(self) -> None:
        if self.is_correction not in ("none", "tis", "icepop"):
            raise ConfigError(f"algo.is_correction must be none, tis or icepop, got {self.is_correction!r}")

    def __call__(self, logp: Tensor, mb: Batch, *, agg: str, normalizer: float) -> tuple[Tensor, dict[str, float]]:
        old = logp.detach()
        weights = None
        if self.is_correction == "tis":
            weights = truncated_is_weights(old, mb.rollout_logprobs, self.is_cap)
        elif self.is_correction == "icepop":
            weights = masked_is_weights(old, mb.rollout_logprobs, self.icepop_low, self.icepop_high)
        loss, metrics = ppo_clip_loss(logp, old, mb.advantages, mb.action_mask, eps_low=self.eps_low,
                                      eps_high=self.eps_high, dual_clip_c=self.dual_clip_c, is_weights=weights,
                                      agg=agg, normalizer=normalizer)
        if weights is not None:
            act = mb.action_mask.bool()
            metrics["is/weight_mean"] = float(weights[act].mean()) if act.any() else 0.0
            metrics["is/zero_frac"] = float((weights[act] == 0).float().mean()) if act.any() else 0.0
        return loss, metrics


def _dis(cfg: AlgoConfig) -> PolicyLoss:
    return DISLoss(*_band(cfg, DISLoss.eps_low, DISLoss.eps_high))


def _ppo(cfg: AlgoConfig) -> PolicyLoss:
    return PPOClipLoss(*_band(cfg, PPOClipLoss.eps_low, PPOClipLoss.eps_high), cfg.dual_clip_c, cfg.is_correction,
                       cfg.is_cap, cfg.icepop_low, cfg.icepop_high)


LOSSES: dict[str, Callable[[AlgoConfig], PolicyLoss]] = {"dis": _dis, "ppo": _ppo}
"""``algo.loss``: each policy loss built from an algorithm's config (the names: ``sao.rl.config.LOSSES``)."""


def make_loss(cfg: AlgoConfig) -> PolicyLoss:
    """The policy loss ``cfg.loss`` names (:data:`LOSSES`) with ``cfg``'s knobs. A band left None
    (``sao.rl.config.resolve_defaults`` fills it from the env's domain) is the loss's own default:
    math's DIS band, PPO's clip-higher range."""
    build = LOSSES.get(cfg.loss)
    if build is None:
        raise ConfigError(f"algo.loss must be 'dis' or 'ppo', got {cfg.loss!r}")
    return build(cfg)


def _band(cfg: AlgoConfig, low: float, high: float) -> tuple[float, float]:
    return (low if cfg.eps_low is None else cfg.eps_low, high if cfg.eps_high is None else cfg.eps_high)
