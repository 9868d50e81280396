"""collate's GRPO groups: one group per draw of a prompt, not per task id."""

from __future__ import annotations

import pytest

from sao.agents.records import RolloutMeta, Trajectory
from sao.rl.learner.batch import collate
from sao.rl.objectives.advantages import grpo_advantages


def traj(task: str, sample: int, reward: float, prompt_index: int | None) -> Trajectory:
    meta = None if prompt_index is None else RolloutMeta(prompt_index, 0)  # as the rollout sources stamp it
    return Trajectory(episode_id=f"{task}-{prompt_index}-{sample}", env="sao/Test-v0", task_id=task, sample=sample,
                      seed=None, token_ids=(1, 2, 3), action_mask=(0, 1, 1), logprobs=(0.0, -1.0, -1.0), turns=(),
                      messages=(), reward=reward, terminated=True, truncated=False, status="ok", rollout=meta)


def test_two_draws_of_one_task_in_a_batch_are_two_groups():
    # A finite dataset re-permuted per epoch can draw task "t3" twice in one batch: prompt 4 (epoch 0)
    # and prompt 9 (epoch 1), two samples each, with task "t1" (prompt 5) between them.
    trajectories = [traj("t3", 0, 1.0, 4), traj("t3", 1, 0.0, 4), traj("t1", 0, 1.0, 5), traj("t1", 1, 1.0, 5),
                    traj("t3", 0, 1.0, 9), traj("t3", 1, 1.0, 9)]
    b = collate(trajectories, pad_id=0)
    assert b.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    adv = grpo_advantages(b.rewards, b.group_ids)
    # per draw: prompt 4 has R = [1, 0]: mean 0.5, std (n - 1) = sqrt(0.5) = 0.707 -> +-0.5 / 0.707 = +-0.707;
    # prompt 9 has R = [1, 1]: all equal -> 0. (Merged by task id, t3's four rewards [1, 0, 1, 1] would
    # give mean 0.75, std 0.5 -> [0.5, -1.5, 0.5, 0.5].)
    assert adv.tolist() == pytest.approx([0.7071, -0.7071, 0.0, 0.0, 0.0, 0.0], abs=1e-4)


def test_trajectories_without_a_prompt_index_group_by_task():
    # built by hand, with no source to stamp a draw: samples of one task id are one group, as before
    b = collate([traj("a", 0, 1.0, None), traj("b", 0, 0.0, None), traj("a", 1, 0.0, None)], pad_id=0)
    assert b.group_ids.tolist() == [0, 1, 0]


def test_text_mode_trajectories_are_refused_with_the_reason():
    from dataclasses import replace as _replace

    t = traj("t0", 0, 1.0, 0)
    text = _replace(t, token_ids=(), action_mask=(), logprobs=(), mode="text")
    with pytest.raises(ValueError, match="text mode"):
        collate([t, text], pad_id=0)
