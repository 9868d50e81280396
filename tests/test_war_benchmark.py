"""benchmarks/war.py's suffix part without engines: the calibration, the load-aware arm's schedule and the
table and verdicts it prints, with ``run_arm`` scripted (the real arms start vLLM)."""

from __future__ import annotations

import argparse

import pytest
from rich.console import Console

from sao.agents.engine.metrics import EngineMetrics
from tests.benchmark_module import load

war = load("war")

# tokens/s by arm and level: suffix wins at 1 and 4, loses at 16; the load-aware engine follows plain above 4
SPEED = {"off": {1: 10.0, 4: 30.0, 16: 60.0}, "suffix": {1: 20.0, 4: 33.0, 16: 40.0},
         "load_aware": {1: 19.0, 4: 32.0, 16: 59.0}}


def test_the_load_aware_arm_runs_the_calibrated_schedule_and_reports_its_worst_ratio(monkeypatch, tmp_path):
    seen = {}

    def run_arm(arm, model, log_dir, speculative, warm, per_level, temperature, console):  # type: ignore[no-untyped-def]
        seen[arm] = speculative
        return [war.Level(arm, c, len(r), int(SPEED[arm][c] * 10), 10.0, EngineMetrics()) for c, r in per_level.items()]

    monkeypatch.setattr(war, "run_arm", run_arm)
    requests = [war.Request([1, 2, 3], 8, i) for i in range(80)]
    args = argparse.Namespace(levels="1,4,16", warmup=4, group=1, out=tmp_path, temperature=1.0)
    console = Console(record=True, width=200)
    report = war.suffix_arms(args, "model", requests, console)
    out = console.export_text()
    assert report["threshold"] == 4 and report["schedule"] == [[1, 4, 24], [5, 5, 0]]
    assert seen["off"].method == "none" and seen["suffix"].schedule == ()
    assert seen["load_aware"].method == "suffix" and seen["load_aware"].schedule == ((1, 4, 24), (5, 5, 0))
    assert "load-aware engine from this calibration: --speculative suffix --spec-schedule 1-4:24,5-:0" in out
    assert "lowest 0.98x (met)" in out and "2.00x (met)" in out
    assert [round(r["load_aware_ratio"], 2) for r in report["levels"]] == [1.9, 1.07, 0.98]


def test_suffix_that_never_wins_calibrates_to_plain_decoding(monkeypatch, tmp_path):
    seen = {}

    def run_arm(arm, model, log_dir, speculative, warm, per_level, temperature, console):  # type: ignore[no-untyped-def]
        seen[arm] = speculative
        speed = {"off": 10.0, "suffix": 8.0, "load_aware": 9.0}[arm]
        return [war.Level(arm, c, len(r), int(speed * 10), 10.0, EngineMetrics()) for c, r in per_level.items()]

    monkeypatch.setattr(war, "run_arm", run_arm)
    args = argparse.Namespace(levels="1,4", warmup=0, group=1, out=tmp_path, temperature=1.0)
    console = Console(record=True, width=200)
    report = war.suffix_arms(args, "model", [war.Request([1], 8, i) for i in range(40)], console)
    out = console.export_text()
    assert report["threshold"] is None and report["schedule"] == [] and report["load_aware"] == "none"
    assert seen["load_aware"] == war.SpeculativeConfig()  # a plain engine: no speculative method at all
    assert "load-aware engine from this calibration: --speculative none" in out
    assert "lowest 0.90x (not met)" in out  # the verdict is the measured ratio, whatever the policy


def test_traces_round_trip_and_group_back_into_episodes(tmp_path):
    traces = load("war_traces")
    routing = load("war_routing")
    requests = [traces.Request([1, 2, 3 + k], 8, 1000 * i + k) for i in (0, 1, 2) for k in range(3 - i)]
    traces.save(tmp_path / "t" / "traces.jsonl", requests)
    back = traces.load(tmp_path / "t" / "traces.jsonl")
    assert back == requests
    assert [len(e) for e in routing.episodes_of(back)] == [3, 2, 1]
    assert [r.seed for r in routing.episodes_of(back)[0]] == [0, 1, 2]


def test_each_trace_env_has_its_episode_setup_and_an_unknown_one_is_refused():
    traces = load("war_traces")
    kwargs, loop, concurrency = traces.episode_setup("swe-local")
    assert kwargs == {"max_steps": traces.SWE_TURNS} and loop.max_turns == traces.SWE_TURNS and concurrency <= 8
    assert loop.max_tokens_per_turn == traces.PER_TURN
    kwargs, loop, _ = traces.episode_setup("arithmetic")
    ids = traces.task_ids("arithmetic", kwargs, 12)
    assert len(set(ids)) == 12 and kwargs["tools"] == "python"
    with pytest.raises(SystemExit, match="--trace-env takes one of arithmetic, swe-local"):
        traces.episode_setup("swe-bench")
