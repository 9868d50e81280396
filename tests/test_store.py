"""Append-only trajectory storage survives a torn last line."""

from __future__ import annotations

import pytest

from sao.agents.records import Trajectory, TurnRecord, VersionSpan
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
