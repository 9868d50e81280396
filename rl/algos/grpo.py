"""GRPO: G samples per prompt and group-relative advantages (METHOD.md 1, baselines), with PPO's
clip (``algo=grpo``) or SAO's DIS (``algo=grpo_dis``); Dr.GRPO drops the std."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from sao.rl.algos.base import Stateless, token_advantages
from sao.rl.algos.policy_losses import PPOClipLoss, make_loss
from sao.rl.config import AlgoConfig
from sao.rl.errors import ConfigError
from sao.rl.learner import Batch, Learner, PolicyLoss
from sao.rl.objectives import grpo_advantages


@dataclass(frozen=True)
class GRPOConfig:
    loss: PolicyLoss = field(default_factory=PPOClipLoss)
    scale_by_std: bool = True  # False: Dr.GRPO

    @classmethod
    def from_algo(cls, cfg: AlgoConfig) -> GRPOConfig:
        if cfg.group_size < 2:
            raise ConfigError(f"GRPO needs algo.group_size >= 2 (samples per prompt), got {cfg.group_size}")
        return cls(loss=make_loss(cfg), scale_by_std=cfg.scale_by_std)


class GRPO(Stateless):
    """Group-relative advantages over G samples per prompt, with PPO's clip (``algo=grpo``) or DIS
    (``algo=grpo_dis``, chosen by ``algo.loss``). The groups are ``batch.group_ids`` (collate sets them)."""

    uses_critic = False
    streams = True  # complete groups carry their own baseline: the step can be taken part by part

    def __init__(self, cfg: GRPOConfig | None = None):
        self.config = cfg or GRPOConfig()
        self._rows: list[Tensor] = []  # per-row advantages of the parts of the step in progress

    @classmethod
    def from_config(cls, cfg: AlgoConfig) -> GRPO:
        return cls(GRPOConfig.from_algo(cfg))

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        per_row = self._advantages(batch)
        metrics = learner.policy_step(batch, token_advantages(batch, per_row), self.config.loss)
        return metrics | self._adv_metrics(per_row)

    # RolloutPipe's complete-group pipelining: micro-batches of whole groups as they complete.
    def begin(self, learner: Learner) -> None:
        self._rows = []
        learner.begin_policy_step()

    def accumulate(self, learner: Learner, batch: Batch) -> None:
        per_row = self._advantages(batch)
        learner.accumulate_policy(batch, token_advantages(batch, per_row), self.config.loss)
        self._rows.append(per_row)

    def finish(self, learner: Learner) -> dict[str, float]:
        metrics = learner.finish_policy_step()
        return metrics | self._adv_metrics(torch.cat(self._rows))

    def _advantages(self, batch: Batch) -> Tensor:
        if batch.group_ids is None:
            raise ValueError("GRPO needs batch.group_ids (collate sets them)")
        return grpo_advantages(batch.rewards, batch.group_ids, scale_by_std=self.config.scale_by_std)

    @staticmethod
    def _adv_metrics(per_row: Tensor) -> dict[str, float]:
        return {"adv/mean": float(per_row.mean()),
                "adv/zero_frac": float((per_row == 0).float().mean())}  # rows in all-equal groups: no signal
