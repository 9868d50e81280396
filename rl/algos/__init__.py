"""The algorithms: one small module per ``algo=...`` name, all on the same data path.

Each algorithm turns a :class:`~sao.rl.learner.batch.Batch` of finished trajectories into one policy update
(plus its critic's, if it has one) through the :class:`~sao.rl.learner.learner.Learner`'s building blocks.
They differ in exactly two places, which is what the ablations of METHOD.md 1 compare:

=================  ==========  ==================================================  =========
``algo``           samples     advantage                                           loss
=================  ==========  ==================================================  =========
``sao``            1/prompt    GAE over action tokens, length-adaptive lambda, V   DIS
``ppo``            1/prompt    GAE over action tokens, fixed lambda, V (VAPO-like)  PPO clip
``grpo``           G/prompt    (R - mean_group) / std_group (Dr.GRPO: no std)      PPO clip
``grpo_dis``       G/prompt    the same group advantage                            DIS
``reinforce_mean`` 1/prompt    R - running mean of the last 8 rewards              DIS
``sft``            1/prompt    none: demonstrations (the warm start)               cross-entropy
=================  ==========  ==================================================  =========

Each ``algo=`` option has its own typed config (:class:`SAOConfig`, :class:`PPOConfig`, :class:`GRPOConfig`,
:class:`GRPODISConfig`, :class:`ReinforceMeanConfig`, :class:`SFTConfig`; defined in :mod:`sao.rl.config`, the schema behind
``conf/algo/``, which checks it); ``Class.from_config`` builds the algorithm from its own config and
:func:`make_algorithm` picks the class by name. The policy losses (:class:`DISLoss`, :class:`PPOClipLoss`,
:func:`make_loss`) are in ``policy_losses``.
"""

from __future__ import annotations

from sao.hints import did_you_mean
from sao.rl.algos.base import Algorithm, CriticAlgorithm, LearnsFromDemonstrations, token_advantages
from sao.rl.algos.grpo import GRPO, GRPOConfig, GRPODISConfig
from sao.rl.algos.policy_losses import DISLoss, PPOClipLoss, make_loss
from sao.rl.algos.ppo import PPO, PPOConfig
from sao.rl.algos.reinforce_mean import ReinforceMean, ReinforceMeanConfig
from sao.rl.algos.sao import SAO, SAOConfig
from sao.rl.algos.sft import SFT, CrossEntropyLoss, SFTConfig
from sao.rl.config import AlgoConfig, ConfigError

__all__ = ["ALGORITHMS", "Algorithm", "CriticAlgorithm", "CrossEntropyLoss", "DISLoss", "LearnsFromDemonstrations", "GRPO", "GRPOConfig", "GRPODISConfig", "PPO",
           "PPOClipLoss", "PPOConfig", "ReinforceMean", "ReinforceMeanConfig", "SAO", "SAOConfig", "SFT", "SFTConfig", "make_algorithm",
           "make_loss", "token_advantages"]

ALGORITHMS: dict[str, type] = {"sao": SAO, "ppo": PPO, "grpo": GRPO, "grpo_dis": GRPO, "reinforce_mean": ReinforceMean,
                             "sft": SFT}
"""Each ``algo=`` option's class; its config is ``sao.rl.config.ALGO_CONFIGS`` under the same name."""


def make_algorithm(cfg: AlgoConfig) -> Algorithm:
    """The algorithm named ``cfg.name``; an unknown name suggests the closest known one."""
    cls = ALGORITHMS.get(cfg.name)
    if cls is None:
        raise ConfigError(f"unknown algo {cfg.name!r} (known: {', '.join(ALGORITHMS)})"
                          + did_you_mean(cfg.name, ALGORITHMS, clause=True))
    return cls.from_config(cfg)
