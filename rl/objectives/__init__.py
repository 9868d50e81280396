"""The RL math, as small pure functions tested against hand-derived numbers: advantages and
baselines (:mod:`.advantages`), policy and value losses (:mod:`.losses`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "advantages": ["RunningMeanBaseline", "adaptive_lambda", "gae_action_tokens", "grpo_advantages",
                       "token_rewards"],
        "losses": ["AGG_MODES", "aggregate", "cross_entropy_loss", "dis_mask", "dis_policy_loss", "kl_estimates", "masked_is_weights",
                   "ppo_clip_loss", "truncated_is_weights", "value_loss"],
    },
)
