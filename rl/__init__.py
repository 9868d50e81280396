"""The learner (SAO and its baselines), its training loop, and the rollout schedulers.

Names are imported on first use (PEP 562), so that ``sao.rl.rollout.schedulers`` (pure Python: the schedulers
and the simulator) and light entry points do not pay for torch.

RL math (small pure functions): ``token_rewards``, ``adaptive_lambda``, ``gae_action_tokens``,
``grpo_advantages``, ``RunningMeanBaseline`` (``advantages``); ``aggregate``, ``dis_mask``,
``dis_policy_loss``, ``ppo_clip_loss``, ``truncated_is_weights``, ``masked_is_weights``,
``value_loss``, ``kl_estimates`` (``losses``).
Learner: ``Batch``, ``collate``, ``micro_batches`` (``batch``); ``ValueModel`` (``value``);
``Learner``, ``LearnerConfig``, ``token_logprobs`` (``learner``); algorithms ``ALGORITHMS``,
``make_algorithm`` (``algos``).
Weight sync: ``save_checkpoint``, ``prune_versions``, ``list_versions``, ``WeightSync``,
``NcclWeightSync`` (a GPU seam, not implemented) (``sync``).
Training: ``TrainConfig`` (``config``), ``Trainer`` (``trainer``), ``run_training`` (``build``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    ".objectives.advantages": ("RunningMeanBaseline", "adaptive_lambda", "gae_action_tokens", "grpo_advantages", "token_rewards"),
    ".objectives.losses": ("AGG_MODES", "aggregate", "dis_mask", "dis_policy_loss", "kl_estimates", "masked_is_weights",
                "ppo_clip_loss", "truncated_is_weights", "value_loss"),
    ".learner.batch": ("Batch", "collate", "micro_batches"),
    ".learner.learner": ("Learner", "LearnerConfig", "token_logprobs"),
    ".learner.value_model": ("ValueModel",),
    ".algos": ("ALGORITHMS", "make_algorithm"),
    ".weights.sync": ("NcclWeightSync", "WeightSync", "list_versions", "prune_versions", "save_checkpoint"),
    ".config": ("TrainConfig",),
    ".training.trainer": ("Trainer",),
    ".training.build": ("run_training",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
