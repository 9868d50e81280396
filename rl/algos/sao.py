"""SAO (METHOD.md 1): one rollout per prompt, a value model trained with TTUR, GAE over action tokens
with the length-adaptive lambda, and the DIS loss against the engine's log-probs.

The pieces (:meth:`SAO.advantages`, :meth:`SAO.with_critic_targets`, :meth:`SAO.critic_steps`) are
built on the :class:`~sao.rl.learner.learner.Learner`'s generic blocks (``predict_values``, ``value_step``,
``policy_step``); :class:`~sao.rl.algos.ppo.PPO` reuses them with a fixed lambda.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from sao.rl.algos.base import Stateless, own_config
from sao.rl.algos.policy_losses import make_loss
from sao.rl.config import AlgoConfig, PPOConfig, SAOConfig
from sao.rl.learner import Batch, Learner, explained_variance, first_action_explained_variance
from sao.rl.learner.ridge_head import head_fit_step
from sao.rl.objectives import adaptive_lambda, gae_action_tokens, token_rewards

__all__ = ["SAO", "SAOConfig"]


class SAO(Stateless):
    """Single rollout + value model + adaptive-lambda GAE over action tokens + DIS (METHOD.md 1).
    Its knobs: :class:`~sao.rl.config.SAOConfig` (defaults: the paper's math setting)."""

    uses_critic = True
    config: SAOConfig | PPOConfig  # PPO runs this machinery with its own config (a fixed lambda)

    def __init__(self, cfg: SAOConfig | PPOConfig | None = None):
        self.config = cfg or SAOConfig()
        self.loss = make_loss(self.config)

    @classmethod
    def from_config(cls, cfg: AlgoConfig) -> SAO:
        return cls(own_config(cfg, SAOConfig))

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        """One SAO update on ``batch``: advantages and critic targets from the value model BEFORE it
        moves (so the critic never sees the outcome it is baselining), then ``ttur_k`` value steps
        and one policy step (METHOD.md 1.4). The values before the critic moves are those of the first
        value step's own forward pass (:meth:`Learner.first_value_step`), so no separate pass computes
        them. Returns the last value step's and the policy step's metrics."""
        batch = batch.to(learner.device)
        metrics, values = self.critic_steps(learner, batch)
        advantages = self.advantages(learner, batch, values)
        metrics |= learner.policy_step(batch, advantages, self.loss, apply=self.steps_on(batch))
        act = batch.action_mask.bool()
        metrics["adv/mean"] = float(advantages[act].mean()) if act.any() else 0.0
        return metrics

    def steps_on(self, batch: Batch) -> bool:
        """Whether ``batch`` takes a policy step: always, unless ``step_on_equal_rewards`` is false and
        every reward in it is the same (the whole batch's, so every data-parallel rank agrees)."""
        return self.config.step_on_equal_rewards or bool((batch.rewards != batch.rewards[0]).any())

    def critic_steps(self, learner: Learner, batch: Batch) -> tuple[dict[str, float], tuple[Tensor, Tensor]]:
        """``ttur_k`` value steps on one target and one clipping anchor, both from the values before the
        first step (taken in that step's forward pass). Returns the metrics (with the explained
        variance of those values, pooled over action tokens and at each row's first action token; NaN
        where the returns are all equal) and the values. With ``value_head_ridge`` the head is solved
        in closed form on every batch so far instead (:func:`~sao.rl.learner.ridge_head.head_fit_step`), the
        trunk frozen: no gradient step."""

        def targets(mb: Batch, v: Tensor, last: Tensor) -> Batch:
            return self.with_critic_targets(learner, mb, (v, last))

        closed_form = self.config.value_head_ridge is not None  # the head solved, the trunk frozen: no steps
        metrics, values = (head_fit_step if closed_form else Learner.first_value_step)(learner, batch, targets)
        batch = self.with_critic_targets(learner, batch, values)
        act = batch.action_mask.bool()
        metrics["value/explained_var"] = explained_variance(batch.old_values[act], batch.returns[act])
        metrics["value/explained_var_first"] = first_action_explained_variance(batch.old_values, batch.returns,
                                                                               batch.action_mask)
        for _ in range(0 if closed_form else self.config.ttur_k - 1):
            metrics |= learner.value_step(batch)
        return metrics, values

    def pretrain_critic(self, learner: Learner, batch: Batch) -> dict[str, float]:
        """The critic-only pretraining step (METHOD.md 1.3): :meth:`critic_steps`, no policy step."""
        return self.critic_steps(learner, batch.to(learner.device))[0]

    def advantages(self, learner: Learner, batch: Batch, values: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """SAO's policy advantages [B, T] (METHOD.md 1.6-1.7): GAE over action tokens with reward R at the
        last action token, per-row ``lambda = 1 - 1 / (alpha * l)`` (or the config's fixed lambda, the
        PPO/VAPO-style ablation), and V(after the last token) as the bootstrap of truncated rows only
        (terminated rows bootstrap 0). ``values``: a :meth:`Learner.predict_values` result to reuse;
        computed when None."""
        cfg = self.config
        batch = batch.to(learner.device)
        v, last = values if values is not None else learner.predict_values(batch)
        lam = cfg.lam
        if lam is None:
            lam = adaptive_lambda(batch.action_mask.sum(-1), cfg.alpha)
        bootstrap = torch.where(batch.truncated, last, 0.0)
        adv, _ = gae_action_tokens(token_rewards(batch.action_mask, batch.rewards), v, batch.action_mask,
                                   gamma=cfg.gamma, lam=lam, bootstrap=bootstrap)
        return adv

    def with_critic_targets(self, learner: Learner, batch: Batch,
                            values: tuple[Tensor, Tensor] | None = None) -> Batch:
        """``batch`` with ``returns`` (lambda_critic = 1: the discounted reward-to-go, plus V(after the last
        token) for truncated rows) and ``old_values`` (the current predictions, the clipping anchor)."""
        batch = batch.to(learner.device)
        v, last = values if values is not None else learner.predict_values(batch)
        bootstrap = torch.where(batch.truncated, last, 0.0)
        _, returns = gae_action_tokens(token_rewards(batch.action_mask, batch.rewards), v, batch.action_mask,
                                       gamma=self.config.gamma, lam=1.0, bootstrap=bootstrap)
        return replace(batch, returns=returns, old_values=v)
