"""The capture proxy's counts in sao-eval's summary (sao.evals.capture_counts), from hand-made episode records:
summed over an agent plug-in's episodes, absent (not zeros) for a run without one, and in the printed table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sao.agents import Trajectory
from sao.evals.capture_counts import capture_counts
from sao.evals.cli import _print_summary
from sao.evals.runner import EvalConfig, summarize
from tests.agent_plugins import FAKE, install_agents


def record(task_id: str, stats: dict[str, Any] | None, *, status: str = "ok") -> Trajectory:
    info: dict[str, Any] = {"exit_status": "agent_returned"}
    if stats is not None:
        info["capture"] = {"calls": stats["calls"] + stats["failed_calls"], "stats": stats, "segments": []}
    return Trajectory(episode_id=task_id, env="arithmetic", task_id=task_id, sample=0, seed=0, token_ids=(),
                      action_mask=(), logprobs=(), turns=(), messages=(), reward=0.0, terminated=status == "ok",
                      truncated=False, status=status, info=info, mode="text",
                      failure=None if status == "ok" else "agent_error")


def stats(calls: int, merged: int, split: int, reasons: dict[str, int], pinned: int = 0, failed: int = 0) -> dict[str, Any]:
    return {"calls": calls, "merged": merged, "split": split, "split_reasons": reasons, "pinned_calls": pinned,
            "failed_calls": failed}


EPISODES = {  # a: 5 calls, 3 merged, 1 split (history edited); b: 4 calls, 1 merged, 2 split, 1 failed call;
    # c: the agent raised before calling (a session, no calls); d: never briefed (no capture at all)
    "a": record("a", stats(5, 3, 1, {"prefix_changed": 1})),
    "b": record("b", stats(4, 1, 2, {"prefix_changed": 1, "history_shorter": 1}, pinned=4, failed=1)),
    "c": record("c", stats(0, 0, 0, {}), status="failed"),
    "d": record("d", None, status="failed"),
}


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    install_agents(tmp_path / "dist", monkeypatch, {"asker": f"{FAKE}:ask_model"})
    return "asker"


def test_the_counts_are_the_sums_over_the_records():
    counts = capture_counts(EPISODES.values())
    # calls 5 + 4 + 0 = 9; merged 3 + 1 = 4; split 1 + 2 = 3, of which prefix_changed 1 + 1, history_shorter 1
    assert counts.as_json() == {"episodes": 3, "uncaptured": 1, "calls": 9, "merged": 4, "split": 3,
                                "split_reasons": {"history_shorter": 1, "prefix_changed": 2},
                                "pinned_calls": 4, "failed_calls": 1}
    assert capture_counts([]).as_json()["calls"] == 0


def test_a_plugin_runs_summary_has_them_and_the_table_shows_them(tmp_path: Path, plugin: str,
                                                                 capsys: pytest.CaptureFixture[str]):
    cfg = EvalConfig("arithmetic", tmp_path, agent=plugin, limit=4)
    summary, _ = summarize(cfg, list(EPISODES), 1.0, {(k, 0): t for k, t in EPISODES.items()})
    assert summary["capture"] == capture_counts(EPISODES.values()).as_json()
    assert summary["agent_errors"] == 2  # the failed ones are counted as before
    _print_summary(summary | {"wall_s": 1.0}, tmp_path)
    table = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the rows, the table's rules dropped
    assert "captured calls 9 in 3 episode(s), 1 uncaptured" in table
    assert "calls merged / split 4 / 3" in table and "split reasons history_shorter 1, prefix_changed 2" in table
    assert "calls pinned / failed 4 / 1" in table


def test_a_run_without_a_plugin_has_no_counts_not_zeros(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    for agent in ("llm", "gold"):
        summary, _ = summarize(EvalConfig("arithmetic", tmp_path, agent=agent, limit=1), ["a"], 1.0, {})
        assert "capture" not in summary
        _print_summary(summary, tmp_path)
        assert "captured calls" not in capsys.readouterr().out
    # a plug-in run whose episodes all ended before their agent started still has the key, with its zeros
    summary, _ = summarize(EvalConfig("arithmetic", tmp_path, agent="mini-swe-agent", limit=1), ["d"], 1.0,
                           {("d", 0): EPISODES["d"]})
    assert summary["capture"] == {"episodes": 0, "uncaptured": 1, "calls": 0, "merged": 0, "split": 0,
                                  "split_reasons": {}, "pinned_calls": 0, "failed_calls": 0}
