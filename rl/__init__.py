"""The learner (SAO and its baselines). Public surface so far: the RL math as small pure functions.

Advantages (``sao.rl.advantages``): ``token_rewards``, ``adaptive_lambda``, ``gae_action_tokens``,
``grpo_advantages``, ``RunningMeanBaseline``.
Losses (``sao.rl.losses``): ``aggregate``, ``dis_mask``, ``dis_policy_loss``, ``ppo_clip_loss``,
``truncated_is_weights``, ``masked_is_weights``, ``value_loss``, ``kl_estimates``.
Batches (``sao.rl.batch``): ``Batch``, ``collate``, ``micro_batches``.
Value model (``sao.rl.value``): ``ValueModel``.
Learner (``sao.rl.learner``): ``Learner``, ``LearnerConfig``, ``token_logprobs``.
Weight sync (``sao.rl.sync``): ``save_checkpoint``, ``prune_versions``, ``list_versions``, ``WeightSync``,
``NcclWeightSync`` (a GPU seam, not implemented).
"""

from sao.rl.advantages import RunningMeanBaseline, adaptive_lambda, gae_action_tokens, grpo_advantages, token_rewards
from sao.rl.losses import (
    AGG_MODES,
    aggregate,
    dis_mask,
    dis_policy_loss,
    kl_estimates,
    masked_is_weights,
    ppo_clip_loss,
    truncated_is_weights,
    value_loss,
)
from sao.rl.batch import Batch, collate, micro_batches
from sao.rl.learner import Learner, LearnerConfig, token_logprobs
from sao.rl.value import ValueModel

__all__ = [
    "AGG_MODES",
    "RunningMeanBaseline",
    "adaptive_lambda",
    "aggregate",
    "dis_mask",
    "dis_policy_loss",
    "gae_action_tokens",
    "grpo_advantages",
    "kl_estimates",
    "masked_is_weights",
    "ppo_clip_loss",
    "token_rewards",
    "truncated_is_weights",
    "value_loss",
    "Batch",
    "collate",
    "micro_batches",
    "Learner",
    "LearnerConfig",
    "token_logprobs",
    "ValueModel",
]

from sao.rl.sync import NcclWeightSync, WeightSync, list_versions, prune_versions, save_checkpoint

__all__ += ["NcclWeightSync", "WeightSync", "list_versions", "prune_versions", "save_checkpoint"]
