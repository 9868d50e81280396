"""``algo.step_on_equal_rewards=false``: a batch whose rewards are all equal trains SAO's critic and leaves the
policy where it was (no optimizer step, no schedule step); a batch with different rewards steps as always;
the default steps on every batch, as the paper's SAO does."""

from __future__ import annotations

import pytest
import torch

from sao.rl.algos import SAO, SAOConfig
from sao.rl.learner.batch import collate
from sao.rl.learner.learner import Learner, LearnerConfig
from sao.rl.learner.value_model import ValueModel

from tests.test_learner import on_policy, random_trajs
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_update(rewards: list[float], step_on_equal_rewards: bool) -> tuple[dict[str, float], bool, bool, int]:
    """One SAO update on a batch with ``rewards``: (metrics, policy moved, critic moved, schedule steps)."""
    torch.manual_seed(0)
    policy = tiny_llama()
    value = ValueModel.from_policy(policy)
    learner = Learner(policy, LearnerConfig(), value_model=value)
    trajs = random_trajs([9, 8, 7, 9][: len(rewards)])
    for t, r in zip(trajs, rewards):
        object.__setattr__(t, "reward", r)
    policy_before = [p.detach().clone() for p in policy.parameters()]
    value_before = [p.detach().clone() for p in value.parameters()]
    batch = on_policy(collate(trajs, pad_id=0), policy)  # ratios near 1: inside DIS's band, a gradient
    metrics = SAO(SAOConfig(step_on_equal_rewards=step_on_equal_rewards)).update(learner, batch)
    moved = lambda now, before: any(not torch.equal(p, b) for p, b in zip(now, before))  # noqa: E731
    return (metrics, moved(policy.parameters(), policy_before), moved(value.parameters(), value_before),
            learner.policy_scheduler.last_epoch)


def test_an_all_equal_batch_trains_the_critic_and_not_the_policy():
    metrics, policy_moved, critic_moved, schedule = run_update([0.0, 0.0, 0.0, 0.0], step_on_equal_rewards=False)
    assert not policy_moved and critic_moved and schedule == 0
    assert metrics["policy/stepped"] == 0.0 and metrics["grad_norm/policy"] > 0  # a gradient, dropped
    assert {"loss/policy", "dis/mask_frac", "rollout/logprob_gap"} <= set(metrics)  # still measured


def test_a_batch_with_different_rewards_steps():
    metrics, policy_moved, critic_moved, schedule = run_update([0.0, 1.0, 0.0, 0.0], step_on_equal_rewards=False)
    assert policy_moved and critic_moved and schedule == 1 and metrics["policy/stepped"] == 1.0
    assert metrics["grad_norm/policy"] > 0


def test_by_default_an_all_equal_batch_still_steps():
    metrics, policy_moved, _, schedule = run_update([1.0, 1.0, 1.0, 1.0], step_on_equal_rewards=True)
    assert policy_moved and schedule == 1 and metrics["policy/stepped"] == 1.0
