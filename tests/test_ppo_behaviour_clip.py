"""PPO's clip (algo=grpo, algo=ppo) is taken against the behaviour policy: the log-probs the engine
reported when it sampled each token (rl/algos/policy_losses.py). With one optimizer step per batch, a
ratio against the learner's own policy at the start of the step is exactly 1, so the clip could never
bind and stale data would be trained as if on-policy. The numbers below are derived by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sao.rl.algos.grpo import GRPO
from sao.rl.algos.policy_losses import PPOClipLoss
from sao.rl.config import GRPOConfig

# One trajectory of 4 positions; the last is not an action token (an observation): never read.
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, -1.0, 0.0]])
# The learner's probabilities now, and the engine's when it sampled (older weights: stale data).
P_NEW = [0.5, 0.2, 0.55, 0.9]
P_ROLLOUT = [0.25, 0.4, 0.5, 0.1]
# ratios pi_new / pi_rollout on the 3 action tokens: 2.0, 0.5, 1.1


def run(loss: PPOClipLoss) -> tuple[float, list[float], dict[str, float]]:
    logp = torch.log(torch.tensor([P_NEW])).requires_grad_(True)
    mb = SimpleNamespace(rollout_logprobs=torch.log(torch.tensor([P_ROLLOUT])), advantages=ADV, action_mask=MASK)
    value, metrics = loss(logp, mb, agg="token-mean", normalizer=None)
    value.backward()
    return value.item(), logp.grad[0].tolist(), metrics


def test_grpo_uses_the_ppo_clip_by_default():
    loss = GRPO(GRPOConfig()).loss
    assert isinstance(loss, PPOClipLoss) and (loss.eps_low, loss.eps_high, loss.is_correction) == (0.2, 0.28, "none")


def test_the_clip_binds_against_the_engines_log_probs():
    value, grad, metrics = run(PPOClipLoss())  # eps 0.2 / 0.28: the band (0.8, 1.28)
    # token 1: r = 0.5/0.25 = 2.0, A = +1: min(2.0 * 1, 1.28 * 1) = 1.28, the clipped term: zero gradient.
    # token 2: r = 0.2/0.4 = 0.5, A = +1: min(0.5, 0.8) = 0.5, the unclipped term (PPO's clip is one-sided):
    #          d/dlogp of -(r * A) / 3 = -r * A / 3 = -0.5/3.
    # token 3: r = 0.55/0.5 = 1.1, A = -1, inside the band: gradient -r * A / 3 = +1.1/3.
    # loss = -(1.28 + 0.5 - 1.1) / 3 = -0.68/3; clip_frac 1/3; mean ratio (2.0 + 0.5 + 1.1)/3 = 1.2.
    assert value == pytest.approx(-0.68 / 3)
    assert grad == pytest.approx([0.0, -0.5 / 3, 1.1 / 3, 0.0])
    assert metrics["ppo/clip_frac"] == pytest.approx(1 / 3) and metrics["ppo/ratio_mean"] == pytest.approx(1.2)


def test_on_policy_data_gives_the_plain_policy_gradient():
    # the engine sampled with the learner's weights (P_ROLLOUT = P_NEW on the action tokens): every ratio
    # is 1, no clip, the gradient -A/3 per token: what the ratio against the learner's own detached
    # log-probs gave on ANY data before the fix, stale or not.
    logp = torch.log(torch.tensor([P_NEW])).requires_grad_(True)
    mb = SimpleNamespace(rollout_logprobs=torch.log(torch.tensor([P_NEW])), advantages=ADV, action_mask=MASK)
    value, metrics = PPOClipLoss()(logp, mb, agg="token-mean", normalizer=None)
    value.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1 / 3, -1 / 3, 1 / 3, 0.0])
    assert metrics["ppo/clip_frac"] == 0.0 and metrics["ppo/ratio_mean"] == pytest.approx(1.0)


def test_decoupled_ppo_clips_against_the_proximal_policy_and_weights_to_the_behaviour_one():
    # is_correction=tis: the ratio against the proximal policy (the learner's own, detached) is 1 and
    # the clip does not bind; the truncated weight min(pi_prox / pi_rollout, 2) = 2.0, 0.5, 1.1 carries
    # the correction: gradient -w * A / 3 = -2/3, -0.5/3, +1.1/3; loss -(2 + 0.5 - 1.1)/3 = -1.4/3.
    value, grad, metrics = run(PPOClipLoss(is_correction="tis", is_cap=2.0))
    assert value == pytest.approx(-1.4 / 3)
    assert grad == pytest.approx([-2 / 3, -0.5 / 3, 1.1 / 3, 0.0])
    assert metrics["ppo/clip_frac"] == 0.0 and metrics["is/weight_mean"] == pytest.approx(3.6 / 3)
    # icepop [0.5, 2]: the same weights here (all three inside the closed interval); with [0.6, 1.5]
    # tokens 1 (2.0) and 2 (0.5) are zeroed: only token 3 is left, -1.1 * -1 / 3.
    value, grad, metrics = run(PPOClipLoss(is_correction="icepop", icepop_low=0.6, icepop_high=1.5))
    assert value == pytest.approx(1.1 / 3) and grad == pytest.approx([0.0, 0.0, 1.1 / 3, 0.0])
    assert metrics["is/zero_frac"] == pytest.approx(2 / 3)
