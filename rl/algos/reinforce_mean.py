"""Single rollout with a running-mean baseline (METHOD.md 1, baselines: window 8), DIS loss."""

from __future__ import annotations

from typing import Any

import torch

from sao.rl.algos.base import own_config, token_advantages
from sao.rl.algos.policy_losses import make_loss
from sao.rl.config import AlgoConfig, ReinforceMeanConfig
from sao.rl.learner import Batch, Learner
from sao.rl.objectives import RunningMeanBaseline

__all__ = ["ReinforceMean", "ReinforceMeanConfig"]


class ReinforceMean:
    """Single rollout with a running-mean baseline over the last ``baseline_window`` rewards, DIS
    loss. The baseline is global and taken before each reward is added."""

    uses_critic = False

    def __init__(self, cfg: ReinforceMeanConfig | None = None):
        self.config = cfg = cfg or ReinforceMeanConfig()
        self.loss = make_loss(cfg)
        self.baseline = RunningMeanBaseline(cfg.baseline_window)

    @classmethod
    def from_config(cls, cfg: AlgoConfig) -> ReinforceMean:
        return cls(own_config(cfg, ReinforceMeanConfig))

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        per_row = torch.tensor([self.baseline.advantage(float(r)) for r in batch.rewards], dtype=torch.float32)
        metrics = learner.policy_step(batch, token_advantages(batch, per_row), self.loss)
        metrics["adv/mean"] = float(per_row.mean())
        metrics["baseline/mean"] = self.baseline.baseline()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])
