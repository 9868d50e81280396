"""The tool task's records and its one command (issue 35), with scripted parts: a held-out episode's record in
``eval.jsonl`` shows the tool call and the answer in separate turns; tool calls and model calls per episode
are logged for held-out evaluations and training batches. The real run is tests/test_tool_task_vllm.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sao.agents import ByteTokenizer, ChatRenderer, LoopConfig, OpenAICompletionClient
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.rl.config import ConfigError, SFTConfig, TrainConfig, WarmStartConfig
from sao.rl.errors import TrainError
from sao.rl.rollout.sources import rollout_metrics
from sao.rl.training.early_stop import CurvePoint, Patience
from sao.rl.training.heldout import HeldOutEval, episode_turns, load_results
from sao.rl.training.phase_engine import export_untied, shares_engine
from sao.rl.training.phases import Handover, run_phases, warm_start_config
from sao.rl.warm_start import arithmetic_tool
from test_train import FAST, composed

HELDOUT = {"seed": 0, "difficulty": 1.0, "ops": "*", "max_digits": 3, "tools": "python", "split": "test"}


def renderer_for(tools):  # type: ignore[no-untyped-def]
    return ChatRenderer(ByteTokenizer(), tools)


def heldout(server: FakeServer, path: Path, problems: int = 3) -> HeldOutEval:
    client = OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST)
    loop = LoopConfig(max_turns=3, max_tokens=192, max_model_len=1024, temperature=0.0)
    return HeldOutEval(client=client, renderer_for=renderer_for, env_name="arithmetic", env_kwargs=HELDOUT, loop=loop,
                       problems=problems, concurrency=2, path=path)


def test_a_heldout_record_shows_the_tool_call_and_the_answer_in_separate_turns(tmp_path: Path) -> None:
    """The engine answers as the demonstrator does: per episode the record holds the problem (user), the call
    (assistant, its tool call parsed), the tool's output (tool: the product, computed in the sandbox) and the
    answer (assistant, \\boxed{product}, no call); one tool call and two model calls per episode."""
    path = tmp_path / "eval.jsonl"
    with FakeServer(responder=lambda request, prompt: Reply(text=arithmetic_tool(prompt))) as server:
        result = asyncio.run(heldout(server, path).run(0))
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == 3 and all(r["correct"] and r["status"] == "ok" for r in rows)
    for row in rows:
        assert [t["role"] for t in row["turns"]] == ["user", "assistant", "tool", "assistant"]
        problem, call, output, answer = row["turns"]
        x, y = problem["text"].split("?")[0].removeprefix("What is ").split(" * ")
        product = int(x) * int(y)
        assert call["tool_calls"] == [{"name": "python", "arguments": json.dumps({"code": f"print({x} * {y})"})}]
        assert "\\boxed" not in call["text"] and output["text"].strip() == str(product)
        assert "tool_calls" not in answer and answer["text"] == f"The answer is \\boxed{{{product}}}."
    m = result.metrics()
    assert (m["eval/tool_calls_mean"], m["eval/turns_mean"], m["eval/accuracy"]) == (1.0, 2.0, 1.0)
    assert load_results(path) == {0: {r["task_id"]: True for r in rows}}  # the rows stay readable as before


def test_an_episode_without_a_call_logs_no_tool_call_and_one_turn(tmp_path: Path) -> None:
    """A model that answers at once (wrongly) in its first turn: one model call, no tool call, one assistant
    turn in the record; training batches count the same way (rollout/tool_calls_mean)."""
    path = tmp_path / "eval.jsonl"
    with FakeServer(responder=lambda request, prompt: Reply(text="\\boxed{7}")) as server:
        result = asyncio.run(heldout(server, path, problems=2).run(4))
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert all([t["role"] for t in r["turns"]] == ["user", "assistant"] and not r["correct"] for r in rows)
    assert all("tool_calls" not in r["turns"][1] and r["step"] == 4 for r in rows)
    m = result.metrics()
    assert (m["eval/tool_calls_mean"], m["eval/turns_mean"], m["eval/accuracy"]) == (0.0, 1.0, 0.0)
    batch = rollout_metrics(result.samples, result.samples, 1.0)
    assert (batch["rollout/tool_calls_mean"], batch["rollout/turns_mean"]) == (0.0, 1.0)
    assert [t.role for t in episode_turns(result.samples[0])] == ["user", "assistant"]


# --------------------------------------------------------------------------- the one command: warm start, then RL


class FakePhases:
    """``run_training``'s stand-in: records each call's config and folder, writes what a real phase leaves
    (phase 1: curve.json with a 0.0 -> 0.4 -> 0.3 curve and best_model/; phase 2: two evaluations, 4 of 10
    then 7 of 10 right), and raises in the call numbered ``crash_at`` (the machine died)."""

    def __init__(self, crash_at: int | None = None):
        self.calls: list[tuple[TrainConfig, Path]] = []
        self.crash_at = crash_at

    def __call__(self, cfg: TrainConfig, run_dir: Path) -> dict:
        self.calls.append((cfg, Path(run_dir)))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
        if len(self.calls) == self.crash_at:
            raise RuntimeError("killed")
        if cfg.algo.name == "sft":
            rule = Patience(cfg.eval.patience)
            for step, acc in ((0, 0.0), (5, 0.4), (10, 0.3)):
                rule.observe(CurvePoint(step, acc, acc - 0.1, acc + 0.1))
            (run_dir / "curve.json").write_text(json.dumps(rule.summary()))
            (run_dir / "best_model").mkdir(exist_ok=True)
        else:
            rows = [{"step": s, "task_id": f"t{i}", "correct": i < k} for s, k in ((0, 4), (cfg.max_steps, 7))
                    for i in range(10)]
            (run_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"step": cfg.max_steps}


def tool_task(tmp_path: Path, *overrides: str) -> TrainConfig:
    return replace(composed("experiment=tool-task", "max_steps=6", "warm_start.max_steps=12", "warm_start.lr=2e-4",
                            *overrides), output_dir=str(tmp_path))


def test_the_tool_task_config_is_sao_on_the_tool_env_after_a_warm_start() -> None:
    cfg = composed("experiment=tool-task")
    assert (cfg.algo.name, cfg.env.kwargs["tools"], cfg.env.max_turns) == ("sao", "python", 3)
    assert cfg.warm_start == WarmStartConfig() and cfg.eval.problems == 64
    seeded = composed("experiment=tool-task", "rollout=async", "seed=3")
    first = warm_start_config(seeded, cfg.warm_start, Path("w"))
    assert isinstance(first.algo, SFTConfig) and first.algo.demonstrator == "arithmetic_tool"
    assert (first.max_steps, first.batch_size, first.optim.lr, first.value_pretrain_steps) == (16, 8, 1e-4, 0)
    assert (first.eval.every, first.eval.patience, first.eval.stop_above, first.eval.problems, first.rollout.mode) == (
        1, 2, 0.8, 64, "sync")
    assert (first.seed, first.env, first.warm_start, first.output_dir) == (3, seeded.env, None, "w")
    assert composed().warm_start is None
    with pytest.raises(ConfigError, match="warm_start"):
        composed("experiment=tool-task", "warm_start.patience=0")


def test_the_warm_start_runs_first_and_rl_starts_from_its_best_model(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    train = FakePhases()
    with caplog.at_level(logging.INFO, logger="sao.rl.training.phases"):
        last = run_phases(tool_task(tmp_path), tmp_path, train)
    (first, first_dir), (second, second_dir) = train.calls
    assert (first.algo.name, first.max_steps, first.optim.lr, first_dir) == ("sft", 12, 2e-4, tmp_path / "warm_start")
    assert (second.algo.name, second.max_steps, second_dir, last) == ("sao", 6, tmp_path, {"step": 6})
    assert second.model.name == str((tmp_path / "warm_start" / "best_model").resolve())
    handover = Handover.read(tmp_path / "warm_start" / "handover.json")
    assert handover == Handover(second.model.name, 5, 0.4, True, 10)
    text = caplog.text
    assert "held-out curve (step: accuracy [95% interval]) 0: 0.000 [-0.100, 0.100], 5: 0.400" in text
    assert "best 0.400 at step 5, inside the learnable band 20%-80%" in text
    assert "held-out accuracy 0.400 -> 0.700, +0.300 [" in text and "step 0 -> 6" in text


def test_a_crash_in_rl_resumes_without_redoing_the_warm_start(tmp_path: Path) -> None:
    crashed = FakePhases(crash_at=2)
    with pytest.raises(RuntimeError, match="killed"):
        run_phases(tool_task(tmp_path), tmp_path, crashed)
    assert (tmp_path / "warm_start" / "handover.json").exists()
    with pytest.raises(TrainError, match="already holds a run"):  # a fresh run would overwrite it
        run_phases(tool_task(tmp_path), tmp_path, FakePhases())
    resumed = FakePhases()
    run_phases(tool_task(tmp_path, "resume=true"), tmp_path, resumed)
    [(cfg, run_dir)] = resumed.calls  # phase 2 only, resuming from its own checkpoint
    assert (cfg.algo.name, cfg.resume, run_dir) == ("sao", True, tmp_path)
    assert cfg.model.name == str((tmp_path / "warm_start" / "best_model").resolve())


def test_a_crash_in_the_warm_start_resumes_the_warm_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="killed"):
        run_phases(tool_task(tmp_path), tmp_path, FakePhases(crash_at=1))
    assert not (tmp_path / "warm_start" / "handover.json").exists()
    resumed = FakePhases()
    run_phases(tool_task(tmp_path, "resume=true"), tmp_path, resumed)
    assert [(c.algo.name, c.resume, d.name) for c, d in resumed.calls] == [("sft", True, "warm_start"),
                                                                            ("sao", True, tmp_path.name)]


class FakeEngine:
    """``phase_engine``'s stand-in: records when it starts and stops, and serves ``http://shared:1``."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @contextlib.contextmanager
    def __call__(self, cfg: TrainConfig, run_dir: Path) -> Iterator[TrainConfig]:
        self.events.append("start")
        try:
            yield replace(cfg, engine=replace(cfg.engine, base_url="http://shared:1", served_name="m"))
        finally:
            self.events.append("stop")


def test_both_phases_run_on_the_one_engine_started_for_them_and_it_stops_after_a_crash(tmp_path: Path) -> None:
    train, engine = FakePhases(), FakeEngine()
    run_phases(tool_task(tmp_path), tmp_path, train, engine=engine)
    assert [(c.algo.name, c.engine.base_url, c.engine.served_name) for c, _ in train.calls] == [
        ("sft", "http://shared:1", "m"), ("sao", "http://shared:1", "m")]
    assert engine.events == ["start", "stop"]
    crashed, engine = FakePhases(crash_at=2), FakeEngine()
    with pytest.raises(RuntimeError, match="killed"):
        run_phases(tool_task(tmp_path / "b"), tmp_path / "b", crashed, engine=engine)
    assert engine.events == ["start", "stop"]
    refused = FakeEngine()  # a folder that holds a run is refused before any engine starts
    with pytest.raises(TrainError, match="already holds a run"):
        run_phases(tool_task(tmp_path), tmp_path, FakePhases(), engine=refused)
    assert refused.events == []


def test_one_engine_is_shared_only_where_each_phase_would_start_one_local_engine() -> None:
    cfg = composed("experiment=tool-task")
    assert shares_engine(cfg)
    assert not shares_engine(composed("experiment=tool-task", "engine.base_url=http://h:1"))
    assert not shares_engine(composed("experiment=tool-task", "rollout=async", "rollout.replicas=2"))
    assert shares_engine(composed("experiment=tool-task", "rollout=async"))


def test_the_shared_engines_model_copy_failing_is_a_train_error(tmp_path: Path) -> None:
    with pytest.raises(TrainError, match="could not export /nonexistent/model"):
        export_untied("/nonexistent/model", tmp_path / "out", "float32")


def test_a_bad_rl_config_fails_before_the_warm_start_runs(tmp_path: Path) -> None:
    train = FakePhases()
    with pytest.raises(ConfigError, match="rollout=pipe"):  # SAO is single-rollout; the warm start would pass
        run_phases(tool_task(tmp_path, "rollout=pipe"), tmp_path, train)
    assert train.calls == []


def test_without_a_warm_start_the_run_is_one_phase(tmp_path: Path) -> None:
    train = FakePhases()
    run_phases(replace(composed("max_steps=2"), output_dir=str(tmp_path)), tmp_path, train)
    assert [(c.algo.name, d) for c, d in train.calls] == [("sao", tmp_path)]


def test_the_warm_starts_stop_rule_stops_above_the_band_and_keeps_the_best_inside_it() -> None:
    # 0.1, 0.5 (best), 0.9 > 0.8: stop at once; 0.9 is in the curve but not the best, so RL starts from 0.5
    rule = Patience(3, ceiling=0.8)
    assert [rule.observe(CurvePoint(s, a, a, a)) for s, a in ((0, 0.1), (2, 0.5), (4, 0.9))] == [True, True, False]
    s = rule.summary()
    assert rule.stop and (s["best_step"], s["best_accuracy"], s["in_band"], s["above_ceiling"]) == (2, 0.5, True, True)
    first = Patience(3, ceiling=0.8)  # nothing below the ceiling to keep: the first point is the best
    assert first.observe(CurvePoint(0, 0.95, 0.9, 1.0)) and first.stop and first.summary()["in_band"] is False
    free = Patience(3)  # no ceiling: 0.9 is a best like any other, and no stop
    assert free.observe(CurvePoint(0, 0.9, 0.9, 0.9)) and not free.stop


def test_each_heldout_task_samples_with_its_own_seed_the_same_at_every_evaluation(tmp_path: Path) -> None:
    """At eval.temperature > 0 a shared seed would draw the same random numbers for every task: a first token
    whose distribution hardly depends on the problem then fails (or passes) all of them at once (measured:
    99 of 100 sampled answers began with the same wrong token). Each task gets task_seed(run seed, task id),
    distinct across tasks, the same at every step (the paired difference compares a problem with itself),
    and a function of the run's seed."""
    from sao.agents.loop import task_seed
    from sao.agents.records import Trajectory

    def evaluation(seed: int) -> tuple[HeldOutEval, list[tuple[str, int]]]:
        seen: list[tuple[str, int]] = []

        async def runner(client, *, task_id: str, seed: int):  # type: ignore[no-untyped-def]
            seen.append((task_id, seed))
            return Trajectory(episode_id="e", env="arithmetic", task_id=task_id, sample=0, seed=seed, token_ids=(1,),
                              action_mask=(1,), logprobs=(-1.0,), turns=(), messages=(), reward=1.0,
                              terminated=True, truncated=False, status="ok", info={"correct": True})

        loop = LoopConfig(max_turns=3, max_tokens=192, max_model_len=1024, temperature=1.0)
        return HeldOutEval(client=None, renderer_for=renderer_for, env_name="arithmetic",  # type: ignore[arg-type]
                           env_kwargs=HELDOUT, loop=loop, problems=5, concurrency=2, path=tmp_path / f"{seed}.jsonl",
                           runner=runner, seed=seed), seen

    ev, seen = evaluation(7)
    asyncio.run(ev.run(0))
    first = dict(seen)
    asyncio.run(ev.run(1))
    assert len(seen) == 10 and dict(seen[5:]) == first  # the same seed per task at the next evaluation
    assert len(set(first.values())) == 5 and first == {t: task_seed(7, t, 0) for t in ev.task_ids}
    other, seen_other = evaluation(8)
    asyncio.run(other.run(0))
    assert dict(seen_other).keys() == first.keys() and set(dict(seen_other).values()).isdisjoint(first.values())
