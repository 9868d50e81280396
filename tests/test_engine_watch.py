"""The engine watch of ``sao-eval`` (issue 14): a managed engine that dies mid-run is restarted, and the
episodes it cut run again, once each in the results. Fast: a fake engine over the scripted server,
whose ``kill()`` is the engine's process dying (the real vLLM: ``tests/faults/test_eval_faults.py``)."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import pytest

import sao.envs as E
from sao.agents import Trajectory
from sao.agents.clients.endpoint import Endpoint
from sao.agents.engine.watch import EngineRestartsExhausted, EngineWatch, WatchConfig, rerun_on_death, retry_on_death
from sao.agents.records import ENV_ERROR, INFRA_ERROR
from sao.agents.store import TrajectoryWriter, read_trajectories
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.evals.runner import EvalConfig, run_pairs, summarize

_QUESTION = re.compile(r"What is (\d+) ([-+*/]) (\d+)\?")


class FakeEngine:
    """A managed engine over a :class:`FakeServer`: it is running until the server is killed;
    ``restart`` brings the server back on its port (``fail`` of them raise first), ``stop`` is counted."""

    def __init__(self, server: FakeServer, *, fail: int = 0):
        self.server, self.fail = server, fail
        self.restarts = self.stops = 0

    @property
    def running(self) -> bool:
        return not self.server.dead

    def restart(self) -> None:
        self.restarts += 1
        if self.fail:
            self.fail -= 1
            raise RuntimeError("scripted start failure")
        self.server.restart()

    def stop(self) -> None:
        self.stops += 1


def solver(request: dict, prompt: str) -> Reply:
    a, op, b = _QUESTION.search(prompt).groups()  # type: ignore[union-attr]
    value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) // int(b or 1)}[op]
    return Reply(text=f"\\boxed{{{value}}}", delay_s=0.3)


def kill_at(request_number: int, engine: FakeEngine):
    """A responder that answers right, slowly, and kills the engine when request ``request_number`` arrives."""
    seen = {"n": 0}
    lock = threading.Lock()

    def respond(request: dict, prompt: str) -> Reply:
        with lock:
            seen["n"] += 1
            if seen["n"] == request_number:
                threading.Thread(target=engine.server.kill).start()
        return solver(request, prompt)

    return respond


def run_eval(tmp_path: Path, engine: FakeEngine, *, max_restarts: int = 3, tasks: int = 4, samples: int = 2):
    cfg = EvalConfig(benchmark="arithmetic", output=tmp_path, base_url=engine.server.base_url, model="fake",
                     endpoint_mode="chat", limit=tasks, samples=samples, concurrency=4, max_tokens=64, max_turns=2,
                     timeout_s=10.0, max_restarts=max_restarts)
    endpoint = Endpoint(engine.server.base_url, "fake", None, 4096, mode="chat", managed=True, server=engine)
    env = E.make("arithmetic")
    ids = env.unwrapped.task_ids(tasks)
    env.close()
    pairs = [(t, s) for t in ids for s in range(samples)]
    with TrajectoryWriter(tmp_path / "trajectories.jsonl") as writer:
        asyncio.run(run_pairs(cfg, endpoint, {}, pairs, writer))
    return cfg, ids


def test_a_death_mid_run_restarts_the_engine_and_reruns_the_cut_episodes_once_each(tmp_path):
    with FakeServer() as server:
        engine = FakeEngine(server)
        server.responder = kill_at(3, engine)  # 4 in flight, answers take 0.3 s: the death cuts several
        cfg, ids = run_eval(tmp_path, engine)
    trajectories = read_trajectories(tmp_path / "trajectories.jsonl")
    pairs = [(t.task_id, t.sample) for t in trajectories]
    assert len(pairs) == 8 and len(set(pairs)) == 8  # nothing lost, nothing twice
    assert all(t.status == "ok" and t.correct for t in trajectories)  # no cut attempt was recorded
    assert engine.restarts == 1 and len(server.requests) > 8  # the cut episodes asked again
    summary, results = summarize(cfg, ids, wall_s=1.0)
    assert summary["n_episodes"] == 8 and summary["n_failed"] == 0 and summary["pass@1"] == 1.0
    assert all(row["correct"] == [True, True] for row in results)


def test_restarts_used_up_end_the_run_and_keep_the_finished_episodes(tmp_path):
    with FakeServer() as server:
        engine = FakeEngine(server, fail=5)
        server.responder = kill_at(8, engine)  # asked once the first 4 are written; the death cuts 8 at least
        with pytest.raises(EngineRestartsExhausted, match="died 1 time.*2 restart"):
            run_eval(tmp_path, engine, max_restarts=2)
    assert engine.restarts == 2 and engine.stops == 1  # what was left of it is stopped
    finished = read_trajectories(tmp_path / "trajectories.jsonl")
    assert 4 <= len(finished) < 8 and all(t.status == "ok" for t in finished)  # a resumed run plays the rest


def trajectory(status: str = "ok", failure: str | None = None) -> Trajectory:
    return Trajectory("e", "arithmetic", "t", 0, None, (), (), (), (), (), 0.0, status == "ok", False, status,
                      error=None if status == "ok" else "boom", mode="text", failure=failure)


class Process:
    """A bare managed engine: a flag for its process, restarts that succeed at once (unless ``broken``)."""

    def __init__(self, *, broken: bool = False) -> None:
        self.running, self.broken, self.restarts, self.stops = True, broken, 0, 0

    def restart(self) -> None:
        self.restarts += 1
        if self.broken:
            raise RuntimeError("it does not start")
        self.running = True

    def stop(self) -> None:
        self.running = False
        self.stops += 1


def test_once_the_restarts_are_used_up_the_watch_declares_no_more_deaths():
    engine = Process(broken=True)

    async def go() -> EngineWatch:
        async with EngineWatch(engine, WatchConfig(interval_s=0.01, max_restarts=1)) as watch:
            engine.running = False
            with pytest.raises(EngineRestartsExhausted, match="died 1 time"):
                await _ready_after_death(watch)
            await asyncio.sleep(0.2)  # many polls of an engine still not running
            return watch

    watch = asyncio.run(go())
    assert (watch.deaths, watch.restarts, engine.restarts, engine.stops) == (1, 1, 1, 1)


async def _ready_after_death(watch: EngineWatch) -> int:
    while watch.deaths == 0:
        await asyncio.sleep(0.01)
    return await watch.ready()


def test_a_failed_attempt_makes_the_watch_look_at_once_and_it_runs_again():
    # The poll is an hour away: only the at-once look after a failed attempt can see the death.
    engine, attempts = Process(), []

    async def attempt() -> Trajectory:
        attempts.append(1)
        if len(attempts) == 1:
            engine.running = False  # the engine died under it: its requests failed
            return trajectory("failed", INFRA_ERROR)
        return trajectory()

    async def go() -> Trajectory:
        async with EngineWatch(engine, WatchConfig(interval_s=3600)) as watch:
            t = await rerun_on_death(watch, attempt)
            assert watch.generation == 1 and watch.restarts == 1
            return t

    assert asyncio.run(go()).status == "ok" and len(attempts) == 2 and engine.restarts == 1


def test_failures_on_a_live_engine_are_results_not_reruns():
    engine = Process()

    async def go(result: Trajectory) -> Trajectory:
        async with EngineWatch(engine, WatchConfig(interval_s=3600)) as watch:
            async def attempt() -> Trajectory:
                return result
            return await rerun_on_death(watch, attempt)

    assert asyncio.run(go(trajectory("failed", INFRA_ERROR))).status == "failed"  # the engine is alive: a result
    assert asyncio.run(go(trajectory("failed", ENV_ERROR))).env_error
    assert engine.restarts == 0


def test_an_attempt_in_flight_is_cancelled_at_the_death_and_its_clean_up_runs():
    engine, started, cleaned = Process(), [], []

    async def attempt() -> Trajectory:
        started.append(1)
        if len(started) == 1:
            try:
                engine.running = False  # dies while this attempt waits for its answer
                await asyncio.sleep(3600)
            finally:
                cleaned.append(1)  # its environment is closed
        return trajectory()

    async def go() -> Trajectory:
        async with EngineWatch(engine, WatchConfig(interval_s=0.05)) as watch:
            return await asyncio.wait_for(rerun_on_death(watch, attempt), 10)

    assert asyncio.run(go()).status == "ok" and len(started) == 2 and cleaned == [1] and engine.restarts == 1


def test_without_a_managed_engine_one_attempt_and_its_errors_pass_through():
    async def boom() -> Trajectory:
        raise KeyError("the caller's bug")

    with pytest.raises(KeyError):
        asyncio.run(rerun_on_death(None, boom))

    async def watched_boom() -> Trajectory:
        async with EngineWatch(Process()) as watch:
            return await rerun_on_death(watch, boom)

    with pytest.raises(KeyError):  # not a cut attempt: raised, not retried
        asyncio.run(watched_boom())
    with pytest.raises(ValueError, match="max_restarts"):
        WatchConfig(max_restarts=-1)


def test_a_call_cut_by_the_death_is_made_again_once_the_restart_hook_ran_and_a_live_engines_error_passes():
    engine, calls, hooked = Process(), [], []

    async def hook() -> None:
        hooked.append(len(calls))  # runs after the restart, before the call is made again

    async def call() -> str:
        calls.append(1)
        if len(calls) == 1:
            engine.running = False  # died under it; its process exit is seen a moment later at most
            raise ConnectionError("reset")
        return "done"

    async def live_error() -> str:
        raise ConnectionError("refused, on a live engine")

    async def go() -> str:
        async with EngineWatch(engine, WatchConfig(interval_s=3600), on_restart=hook) as watch:
            assert await retry_on_death(watch, call) == "done"
            with pytest.raises(ConnectionError, match="live engine"):
                await retry_on_death(watch, live_error, grace_s=0.1)
            return "ok"

    assert asyncio.run(go()) == "ok" and len(calls) == 2 and hooked == [1] and engine.restarts == 1


def test_a_failing_restart_hook_counts_as_a_failed_restart():
    engine, hooks = Process(), []

    async def hook() -> None:
        hooks.append(1)
        if len(hooks) == 1:
            raise RuntimeError("the weights did not load")

    async def go() -> int:
        async with EngineWatch(engine, WatchConfig(interval_s=3600, max_restarts=3), on_restart=hook) as watch:
            engine.running = False
            watch.check()
            return await watch.ready()

    assert asyncio.run(go()) == 1 and engine.restarts == 2 and len(hooks) == 2


class Hooks:
    """Records what a watch tells its owner, in order."""

    def __init__(self) -> None:
        self.said: list[tuple] = []

    def died(self, cause: str, deaths: int) -> None:
        self.said.append(("died", cause, deaths))

    def restarting(self, restart: int, limit: int) -> None:
        self.said.append(("restarting", restart, limit))

    def restart_failed(self, error: Exception) -> None:
        self.said.append(("restart_failed", str(error)))

    def back(self, after_s: float) -> None:
        self.said.append(("back",))

    def gave_up(self, deaths: int, limit: int) -> str:
        self.said.append(("gave_up", deaths, limit))
        return f"gone after {deaths}"


def test_a_health_probe_counts_failures_in_a_row_and_an_at_once_look_needs_one():
    """The one watcher with a /health probe (a training replica): ``failures`` failed looks in a row make
    it dead, a good look in between starts the count again, and an at-once look (a request just failed
    on it) needs one; each death bumps the generation and is told to the hooks with its cause."""
    from sao.agents.engine.watch import Watched

    answers: list[bool] = []

    async def health() -> bool:
        return answers.pop(0)

    async def restart() -> None:
        pass

    async def go() -> tuple[Hooks, EngineWatch]:
        hooks = Hooks()
        watch = EngineWatch(Watched(health=health, restart=restart), WatchConfig(interval_s=3600, failures=3),
                            hooks=hooks)
        answers.extend([False, False, True, False, False])
        for _ in range(5):
            await watch.probe()
        assert watch.generation == 0 and watch.serving  # never 3 failures in a row
        answers.append(False)
        await watch.probe()  # the third in a row
        assert watch.generation == 1 and not watch.serving
        assert await watch.ready() == 1  # restarted at once
        answers.append(False)
        await watch.probe(at_once=True, cause="a request failed")
        assert await watch.ready() == 2
        await watch.__aexit__(None)
        return hooks, watch

    hooks, watch = asyncio.run(go())
    assert hooks.said == [("died", "/health failed 3 time(s) in a row", 1), ("restarting", 1, 3), ("back",),
                          ("died", "a request failed", 2), ("restarting", 2, 3), ("back",)]
    assert (watch.deaths, watch.restarts) == (2, 2)


def test_an_engine_someone_else_owns_is_waited_for_and_restarts_used_up_are_told_once():
    from sao.agents.engine.watch import Watched

    up = {"ok": True}

    async def health() -> bool:
        return up["ok"]

    async def external() -> tuple[int, int]:
        watch = EngineWatch(Watched(health=health), WatchConfig(interval_s=0.01, failures=1), hooks=Hooks())
        up["ok"] = False
        await watch.probe()
        await asyncio.sleep(0.05)
        assert not watch.serving  # no restart of its own: it waits
        up["ok"] = True
        generation = await asyncio.wait_for(watch.ready(), 5)
        await watch.__aexit__(None)
        return generation, watch.restarts

    assert asyncio.run(external()) == (1, 0)

    async def broken() -> None:
        raise OSError("no memory")

    async def used_up() -> Hooks:
        hooks = Hooks()
        watch = EngineWatch(Watched(alive=lambda: False, restart=broken), WatchConfig(max_restarts=2), hooks=hooks)
        watch.check()  # its process exited
        with pytest.raises(EngineRestartsExhausted, match="gone after 1"):
            await watch.ready()
        assert watch.exhausted and not watch.serving
        watch.check()  # no more deaths once given up
        await watch.__aexit__(None)
        return hooks

    assert asyncio.run(used_up()).said == [
        ("died", "engine process exited", 1), ("restarting", 1, 2), ("restart_failed", "no memory"),
        ("restarting", 2, 2), ("restart_failed", "no memory"), ("gave_up", 1, 2)]
