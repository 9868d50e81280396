"""The learner (SAO and its baselines), its training loop, and the rollout.

Packages: the RL math (:mod:`.objectives`), the algorithms (:mod:`.algos`), the learner
(:mod:`.learner`), a training run (:mod:`.training`), the prompts it sees (:mod:`.prompts`), rollout on
real engines (:mod:`.rollout`) with its pure schedulers and simulator (:mod:`.rollout.schedulers`,
:mod:`.rollout.sim`), weights to the engines (:mod:`.weights`), Ray (:mod:`.cluster`) and the entry
points (:mod:`.cli`); the typed configuration is :mod:`.config`, rl/'s errors :mod:`.errors`.
docs/architecture.md maps them.

Names are imported on first use (``lazy_loader.attach``, PEP 562), so that the schedulers and the
simulator (pure Python) and light entry points do not pay for torch.

RL math: ``token_rewards``, ``adaptive_lambda``, ``gae_action_tokens``, ``grpo_advantages``,
``RunningMeanBaseline``; ``aggregate``, ``dis_mask``, ``dis_policy_loss``, ``ppo_clip_loss``,
``truncated_is_weights``, ``masked_is_weights``, ``value_loss``, ``kl_estimates``.
Learner: ``Batch``, ``collate``, ``micro_batches``; ``ValueModel``; ``Learner``, ``LearnerConfig``,
``token_logprobs``; algorithms ``ALGORITHMS``, ``make_algorithm``.
Weight sync: ``save_checkpoint``, ``prune_versions``, ``list_versions``, ``WeightSync``,
``NcclWeightSync`` (a GPU seam, not implemented).
Training: ``TrainConfig``, ``Trainer``, ``run_training``.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "algos": ["ALGORITHMS", "make_algorithm"],
        "config": ["TrainConfig"],
        "errors": ["CheckpointError", "ConfigError", "LedgerError", "ReportError", "RolloutError", "RolloutFailing",
                   "ScheduleError", "SimError", "TrainError"],
        "learner.batch": ["Batch", "collate", "micro_batches"],
        "learner.learner": ["Learner", "LearnerConfig", "token_logprobs"],
        "learner.value_model": ["ValueModel"],
        "objectives.advantages": ["RunningMeanBaseline", "adaptive_lambda", "gae_action_tokens", "grpo_advantages",
                                  "token_rewards"],
        "objectives.losses": ["AGG_MODES", "aggregate", "dis_mask", "dis_policy_loss", "kl_estimates",
                              "masked_is_weights", "ppo_clip_loss", "truncated_is_weights", "value_loss"],
        "training.build": ["run_training"],
        "training.trainer": ["Trainer"],
        "weights.sync": ["NcclWeightSync", "WeightSync", "list_versions", "prune_versions", "save_checkpoint"],
    },
)
