"""PPO with a value model and a fixed lambda: the VAPO-like ablation of METHOD.md 1 (baselines).

SAO's machinery unchanged (value-model GAE over action tokens, lambda_critic = 1 targets, TTUR critic
steps) with a fixed lambda instead of the length-adaptive one, and PPO's clip with clip-higher by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sao.rl.algos.base import Stateless
from sao.rl.algos.policy_losses import PPOClipLoss, make_loss
from sao.rl.algos.sao import SAO, SAOConfig
from sao.rl.config import AlgoConfig
from sao.rl.errors import ConfigError
from sao.rl.learner import Batch, Learner, PolicyLoss


@dataclass(frozen=True)
class PPOConfig:
    loss: PolicyLoss = field(default_factory=PPOClipLoss)
    lam: float = 0.95  # the policy's fixed GAE lambda
    gamma: float = 1.0
    ttur_k: int = 2  # value steps per policy step

    @classmethod
    def from_algo(cls, cfg: AlgoConfig) -> PPOConfig:
        if cfg.lam is None:
            raise ConfigError("algo=ppo needs a fixed algo.lam (e.g. 0.95)")
        return cls(loss=make_loss(cfg), lam=cfg.lam, gamma=cfg.gamma, ttur_k=cfg.ttur_k)


class PPO(Stateless):
    """The VAPO-like ablation: SAO's critic machinery with a fixed lambda and PPO's clip."""

    uses_critic = True

    def __init__(self, cfg: PPOConfig | None = None):
        self.config = cfg = cfg or PPOConfig()
        self.sao = SAO(SAOConfig(loss=cfg.loss, lam=cfg.lam, gamma=cfg.gamma, ttur_k=cfg.ttur_k))

    @classmethod
    def from_config(cls, cfg: AlgoConfig) -> PPO:
        return cls(PPOConfig.from_algo(cfg))

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        return self.sao.update(learner, batch)

    def pretrain_critic(self, learner: Learner, batch: Batch) -> dict[str, float]:
        return self.sao.pretrain_critic(learner, batch)
