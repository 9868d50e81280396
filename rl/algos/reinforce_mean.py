"""Single rollout with a running-mean baseline (METHOD.md 1, baselines: window 8), DIS loss."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sao.rl.algos.base import token_advantages
from sao.rl.algos.policy_losses import DISLoss, make_loss
from sao.rl.config import AlgoConfig
from sao.rl.errors import ConfigError
from sao.rl.learner import Batch, Learner, PolicyLoss
from sao.rl.objectives import RunningMeanBaseline


@dataclass(frozen=True)
class ReinforceMeanConfig:
    loss: PolicyLoss = field(default_factory=DISLoss)
    baseline_window: int = 8  # rewards in the running mean

    @classmethod
    def from_algo(cls, cfg: AlgoConfig) -> ReinforceMeanConfig:
        if cfg.group_size != 1:
            raise ConfigError(f"reinforce_mean samples one rollout per prompt; set algo.group_size=1, "
                              f"not {cfg.group_size}")
        return cls(loss=make_loss(cfg), baseline_window=cfg.baseline_window)


class ReinforceMean:
    """Single rollout with a running-mean baseline over the last ``baseline_window`` rewards, DIS
    loss. The baseline is global and taken before each reward is added."""

    uses_critic = False

    def __init__(self, cfg: ReinforceMeanConfig | None = None):
        self.config = cfg = cfg or ReinforceMeanConfig()
        self.baseline = RunningMeanBaseline(cfg.baseline_window)

    @classmethod
    def from_config(cls, cfg: AlgoConfig) -> ReinforceMean:
        return cls(ReinforceMeanConfig.from_algo(cfg))

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        per_row = torch.tensor([self.baseline.advantage(float(r)) for r in batch.rewards], dtype=torch.float32)
        metrics = learner.policy_step(batch, token_advantages(batch, per_row), self.config.loss)
        metrics["adv/mean"] = float(per_row.mean())
        metrics["baseline/mean"] = self.baseline.baseline()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])
