"""The policy losses the algorithms plug into :meth:`~sao.rl.learner.learner.Learner.policy_step`: small
frozen callables (:class:`~sao.rl.learner.learner.PolicyLoss`) over one micro-batch, each holding its own knobs.

PPO's clip is taken against the BEHAVIOUR policy: the ratio is ``pi_theta / pi_rollout``, with the
log-probs the engine reported when it sampled each token (``batch.rollout_logprobs``), as DIS's is.
With ONE optimizer step per batch (``max_steps`` counts policy steps, each followed by a weight
sync), a ratio against the learner's own policy at the start of the step would be exactly 1: the
clip would never bind, and stale data (``async``, ``multi_version``, ``one_step_off``) would be
trained as if it were on-policy. Against the behaviour policy the clip both bounds the step and
corrects for the staleness.

With ``is_correction`` tis or icepop the loss is decoupled PPO (Hilton et al. 2021) instead: the clip
against the proximal policy (the learner's own at the start of the step: ``logp.detach()`` of the
same forward pass, no second pass needed), times an importance weight from it to the behaviour
policy, truncated (``min(pi_prox / pi_rollout, cap)``) or masked (IcePop). With one step per batch the
proximal clip does not bind, so the weight alone carries the correction.
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
    """PPO's clip with clip-higher (0.2 / 0.28) and optional dual-clip, against the behaviour policy
    (module doc); with ``is_correction`` tis or icepop, decoupled: against the proximal policy, weighted
    ``min(pi_prox / pi_rollout, cap)`` (``tis``) or zeroed where that ratio leaves ``[low, high]`` (``icepop``)."""

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
        old, weights = mb.rollout_logprobs, None  # the behaviour policy
        if self.is_correction != "none":
            old = logp.detach()  # decoupled: the proximal policy, and a weight from it to the behaviour policy
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
