"""PPO with a value model and a fixed lambda: the VAPO-like ablation of METHOD.md 1 (baselines).

SAO's machinery unchanged (value-model GAE over action tokens, lambda_critic = 1 targets, TTUR critic
steps) with a fixed lambda instead of the length-adaptive one, and PPO's clip with clip-higher by default.
"""

from __future__ import annotations

from sao.rl.algos.base import own_config
from sao.rl.algos.sao import SAO
from sao.rl.config import AlgoConfig, PPOConfig

__all__ = ["PPO", "PPOConfig"]


class PPO(SAO):
    """The VAPO-like ablation: SAO's critic machinery with a fixed lambda and PPO's clip
    (:class:`~sao.rl.config.PPOConfig`)."""

    def __init__(self, cfg: PPOConfig | None = None):
        super().__init__(cfg or PPOConfig())

    @classmethod
    def from_config(cls, cfg: AlgoConfig) -> PPO:
        return cls(own_config(cfg, PPOConfig))
