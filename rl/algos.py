"""The algorithms: one small class per ``algo=...`` name, all on the same data path.

Each algorithm turns a :class:`~sao.rl.batch.Batch` of finished trajectories into one policy update
(plus its critic's, if it has one) through the :class:`~sao.rl.learner.Learner`'s building blocks.
They differ in exactly two places, which is what the ablations of METHOD.md 1 compare:

=================  ==========  ==================================================  =========
``algo``           samples     advantage                                           loss
=================  ==========  ==================================================  =========
``sao``            1/prompt    GAE over action tokens, length-adaptive lambda, V   DIS
``ppo``            1/prompt    GAE over action tokens, fixed lambda, V (VAPO-like)  PPO clip
``grpo``           G/prompt    (R - mean_group) / std_group (Dr.GRPO: no std)      PPO clip
``grpo_dis``       G/prompt    the same group advantage                            DIS
``reinforce_mean`` 1/prompt    R - running mean of the last 8 rewards              DIS
=================  ==========  ==================================================  =========

Losses are small callables (:data:`LOSSES`) that the learner calls per micro-batch. The PPO loss
is taken on-policy with ONE optimizer step per batch (``max_steps`` counts policy steps, each
followed by a weight sync), so the "old" policy of its ratio is the learner's own policy at the
start of the step: ``logp.detach()`` of the same forward pass, no second pass needed. The gap to
what the engine sampled with (``batch.rollout_logprobs``) is corrected, as an option, with truncated
or masked (IcePop) importance sampling; DIS instead uses the rollout log-probs directly.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from sao.rl.advantages import RunningMeanBaseline, grpo_advantages
from sao.rl.batch import Batch
from sao.rl.config import AlgoConfig, ConfigError
from sao.rl.learner import DISLoss, Learner, PolicyLoss
from sao.rl.losses import masked_is_weights, ppo_clip_loss, truncated_is_weights

# --------------------------------------------------------------------------- policy losses


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


def make_loss(cfg: AlgoConfig) -> PolicyLoss:
    if cfg.loss == "dis":
        return DISLoss(cfg.eps_low, cfg.eps_high)
    if cfg.loss == "ppo":
        return PPOClipLoss(cfg.eps_low, cfg.eps_high, cfg.dual_clip_c, cfg.is_correction, cfg.is_cap,
                           cfg.icepop_low, cfg.icepop_high)
    raise ConfigError(f"algo.loss must be 'dis' or 'ppo', got {cfg.loss!r}")


# --------------------------------------------------------------------------- algorithms


class Algorithm(Protocol):
    """What the trainer needs from an algorithm."""

    uses_critic: ClassVar[bool]

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        """One policy step (and the critic's steps) on ``batch``; returns metrics."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _token_advantages(batch: Batch, per_row: Tensor) -> Tensor:
    """A per-trajectory advantage [B] broadcast to its action tokens [B, T] (0 elsewhere)."""
    return per_row.to(batch.action_mask.device)[:, None] * batch.action_mask.float()


class _Stateless:
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class SAO(_Stateless):
    """Single rollout + value model + adaptive-lambda GAE over action tokens + DIS (METHOD.md 1)."""

    uses_critic = True

    def __init__(self, cfg: AlgoConfig):
        self.loss = make_loss(cfg)
        self.lam = cfg.lam

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        return learner.sao_step(batch, lam=self.lam, loss_fn=self.loss)


class PPO(SAO):
    """The VAPO-like ablation: the same critic machinery with a fixed lambda and PPO's clip."""

    def __init__(self, cfg: AlgoConfig):
        super().__init__(cfg)
        if self.lam is None:
            raise ConfigError("algo=ppo needs a fixed algo.lam (e.g. 0.95)")


class GRPO(_Stateless):
    """Group-relative advantages over G samples per prompt, with PPO's clip (``algo=grpo``) or DIS
    (``algo=grpo_dis``, chosen by ``algo.loss``)."""

    uses_critic = False
    streams = True  # complete groups carry their own baseline: the step can be taken part by part

    def __init__(self, cfg: AlgoConfig):
        if cfg.group_size < 2:
            raise ConfigError(f"GRPO needs algo.group_size >= 2 (samples per prompt), got {cfg.group_size}")
        self.loss = make_loss(cfg)
        self.scale_by_std = cfg.scale_by_std
        self._rows: list[Tensor] = []  # per-row advantages of the parts of the step in progress

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        per_row = self._advantages(batch)
        metrics = learner.policy_step(batch, _token_advantages(batch, per_row), self.loss)
        return metrics | self._adv_metrics(per_row)

    # RolloutPipe's complete-group pipelining: micro-batches of whole groups as they complete.
    def begin(self, learner: Learner) -> None:
        self._rows = []
        learner.begin_policy_step()

    def accumulate(self, learner: Learner, batch: Batch) -> None:
        per_row = self._advantages(batch)
        learner.accumulate_policy(batch, _token_advantages(batch, per_row), self.loss)
        self._rows.append(per_row)

    def finish(self, learner: Learner) -> dict[str, float]:
        metrics = learner.finish_policy_step()
        return metrics | self._adv_metrics(torch.cat(self._rows))

    def _advantages(self, batch: Batch) -> Tensor:
        if batch.group_ids is None:
            raise ValueError("GRPO needs batch.group_ids (collate sets them)")
        return grpo_advantages(batch.rewards, batch.group_ids, scale_by_std=self.scale_by_std)

    @staticmethod
    def _adv_metrics(per_row: Tensor) -> dict[str, float]:
        return {"adv/mean": float(per_row.mean()),
                "adv/zero_frac": float((per_row == 0).float().mean())}  # rows in all-equal groups: no signal


class ReinforceMean:
    """Single rollout with a running-mean baseline over the last ``baseline_window`` rewards (METHOD.md
    1, baselines), DIS loss. The baseline is global and taken before each reward is added."""

    uses_critic = False

    def __init__(self, cfg: AlgoConfig):
        if cfg.group_size != 1:
            raise ConfigError(f"reinforce_mean samples one rollout per prompt; set algo.group_size=1, "
                              f"not {cfg.group_size}")
        self.loss = make_loss(cfg)
        self.baseline = RunningMeanBaseline(cfg.baseline_window)

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        per_row = torch.tensor([self.baseline.advantage(float(r)) for r in batch.rewards], dtype=torch.float32)
        metrics = learner.policy_step(batch, _token_advantages(batch, per_row), self.loss)
        metrics["adv/mean"] = float(per_row.mean())
        metrics["baseline/mean"] = self.baseline.baseline()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])


ALGORITHMS: dict[str, type] = {"sao": SAO, "ppo": PPO, "grpo": GRPO, "grpo_dis": GRPO, "reinforce_mean": ReinforceMean}


def make_algorithm(cfg: AlgoConfig) -> Algorithm:
    """The algorithm named ``cfg.name``; an unknown name suggests the closest known one."""
    cls = ALGORITHMS.get(cfg.name)
    if cls is None:
        close = difflib.get_close_matches(cfg.name, ALGORITHMS, n=1)
        raise ConfigError(f"unknown algo {cfg.name!r} (known: {', '.join(ALGORITHMS)})"
                          + (f"; did you mean {close[0]!r}?" if close else ""))
    return cls(cfg)
