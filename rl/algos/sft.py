"""``algo=sft``: a warm start from demonstrations, on the same data path as the RL algorithms.

The batches are trajectories a scripted demonstrator played through the agent loop (its tokens exactly what
the loop renders, its log-probs 0: a deterministic policy; :mod:`sao.rl.warm_start`), collated like any
rollout. The update is one :meth:`~sao.rl.learner.learner.Learner.policy_step` with :class:`CrossEntropyLoss`:
cross-entropy on the action tokens only, no advantage, no importance ratio. Why an ``algo`` rather than a
command of its own: the trainer already holds the loop this needs (batches, the learner, weight syncs into
the engine, the held-out evaluation every ``eval.every`` steps, checkpoints and resume), and its stop rule
(``eval.patience``) and the best model it keeps are the hand-over to RL (``model.name=RUN_DIR/best_model``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sao.rl.algos.base import Stateless, own_config
from sao.rl.config import AlgoConfig, SFTConfig
from sao.rl.learner import Batch, Learner
from sao.rl.objectives import cross_entropy_loss

__all__ = ["SFT", "SFTConfig", "CrossEntropyLoss"]


@dataclass(frozen=True)
class CrossEntropyLoss:
    """A :class:`~sao.rl.learner.learner.PolicyLoss` that ignores advantages and rollout log-probs:
    ``-mean log pi(demonstrated token)`` over action tokens (:func:`sao.rl.objectives.cross_entropy_loss`)."""

    def __call__(self, logp: Tensor, mb: Batch, *, agg: str, normalizer: float) -> tuple[Tensor, dict[str, float]]:
        return cross_entropy_loss(logp, mb.action_mask, agg=agg, normalizer=normalizer)


class SFT(Stateless):
    """Supervised fine-tuning on demonstrations (module doc); no critic."""

    uses_critic = False

    def __init__(self, cfg: SFTConfig | None = None):
        self.config = cfg or SFTConfig()
        self.loss = CrossEntropyLoss()

    @property
    def demonstrator(self) -> str:
        """The scripted policy whose episodes it learns from (:data:`sao.rl.warm_start.DEMONSTRATORS`)."""
        return self.config.demonstrator

    @property
    def min_reward(self) -> float:
        return self.config.min_reward

    @classmethod
    def from_config(cls, cfg: AlgoConfig) -> SFT:
        return cls(own_config(cfg, SFTConfig))

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        return learner.policy_step(batch, torch.zeros_like(batch.rollout_logprobs), self.loss)
