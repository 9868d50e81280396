"""GRPO: G samples per prompt and group-relative advantages (METHOD.md 1, baselines), with PPO's
clip (``algo=grpo``) or SAO's DIS (``algo=grpo_dis``); Dr.GRPO drops the std."""

from __future__ import annotations

import torch
from torch import Tensor

from sao.rl.algos.base import Stateless, own_config, token_advantages
from sao.rl.algos.policy_losses import make_loss
from sao.rl.config import AlgoConfig, GRPOConfig, GRPODISConfig
from sao.rl.learner import Batch, Learner
from sao.rl.objectives import grpo_advantages

__all__ = ["GRPO", "GRPOConfig", "GRPODISConfig"]


class GRPO(Stateless):
    """Group-relative advantages over G samples per prompt, with PPO's clip (``algo=grpo``) or DIS
    (``algo=grpo_dis``, chosen by ``algo.loss``; :class:`~sao.rl.config.GRPODISConfig`). The groups are
    ``batch.group_ids`` (collate sets them)."""

    uses_critic = False
    streams = True  # complete groups carry their own baseline: the step can be taken part by part

    def __init__(self, cfg: GRPOConfig | None = None):
        self.config = cfg or GRPOConfig()
        self.loss = make_loss(self.config)
        self._rows: list[Tensor] = []  # per-row advantages of the parts of the step in progress

    @classmethod
    def from_config(cls, cfg: AlgoConfig) -> GRPO:
        return cls(own_config(cfg, GRPOConfig))

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        per_row = self._advantages(batch)
        metrics = learner.policy_step(batch, token_advantages(batch, per_row), self.loss)
        return metrics | self._adv_metrics(per_row)

    # RolloutPipe's complete-group pipelining: micro-batches of whole groups as they complete.
    def begin(self, learner: Learner) -> None:
        self._rows = []
        learner.begin_policy_step()

    def accumulate(self, learner: Learner, batch: Batch) -> None:
        per_row = self._advantages(batch)
        learner.accumulate_policy(batch, token_advantages(batch, per_row), self.loss)
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
