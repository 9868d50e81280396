"""Append-only trajectory storage survives a torn last line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sao.agents.records import RolloutMeta, Trajectory, TurnRecord, VersionSpan
from sao.agents.store import TrajectoryWriter, read_trajectories


def _traj(i: int) -> Trajectory:
    return Trajectory(episode_id=f"e{i}", env="arithmetic", task_id=f"t{i}", sample=0, seed=i,
                      token_ids=(1, 2, 3), action_mask=(0, 1, 1), logprobs=(0.0, -0.1, -0.2),
                      turns=(TurnRecord(1, 2, "stop", "3", 0.0, 0.1, policy_versions=VersionSpan(3, 4)),), messages=({"role": "user", "content": "q"},),
                      reward=1.0, terminated=True, truncated=False, status="ok", info={"correct": True})


def test_torn_last_line_is_ignored_then_cut(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(_traj(0))
        w.write(_traj(1))
    with path.open("a") as fh:
        fh.write(_traj(2).to_json()[:40])  # a run killed mid-write
    assert [t.episode_id for t in read_trajectories(path)] == ["e0", "e1"]
    with TrajectoryWriter(path) as w:
        w.write(_traj(3))
    got = read_trajectories(path)
    assert [t.episode_id for t in got] == ["e0", "e1", "e3"] and got[0] == _traj(0)


def test_version_spans_stay_integers_through_the_file() -> None:
    back = Trajectory.from_json(_traj(0).to_json())
    assert back.policy_versions == (VersionSpan(3, 4),) and back == _traj(0)
    with pytest.raises(ValueError, match="forwards"):
        VersionSpan(4, 3)


def test_rollout_metadata_is_a_record_on_the_trajectory() -> None:
    t = replace(_traj(0), rollout=RolloutMeta(prompt_index=7, policy_version=3, replica=1, attempt=0, train_step=4))
    record = json.loads(t.to_json())
    assert record["rollout"]["prompt_index"] == 7 and "prompt_index" not in record["info"]  # readable, nested
    assert Trajectory.from_json(t.to_json()) == t
    with pytest.raises(TypeError):
        RolloutMeta(prompt_index=7, policy_version=3, prompt_idx=7)  # type: ignore[call-arg]  # a typo fails


def test_a_record_is_one_line_for_any_line_splitter() -> None:
    text = "poem\u2028line two\u2029para\x85next\x0bvt\x1cfs"  # all that str.splitlines() breaks at
    t = replace(_traj(0), messages=({"role": "assistant", "content": text},))
    line = t.to_json()
    assert len((line + "\n").splitlines()) == 1, line
    assert Trajectory.from_json(line) == t and json.loads(line)["messages"][0]["content"] == text
