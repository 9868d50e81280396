"""``rollout=sync`` training whose managed engine dies, with scripted parts (seconds): a tiny policy, the
scripted server as the engine, which dies mid-rollout or mid-sync and is restarted by the run's
:class:`EngineWatch`. The run completes: the episodes the death cut run again and are recorded once, the
restarted engine is given the version it served before it samples again, and a cut sync is made again.
Against the real vLLM: ``test_train_faults.py::test_sync_training_restarts_a_killed_engine``."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import pytest

from sao.agents import ByteTokenizer, ChatRenderer, LoopConfig, OpenAICompletionClient
from sao.agents.engine_watch import EngineWatch, WatchConfig
from sao.agents.errors import EngineError
from sao.agents.fake_server import FakeServer
from sao.rl.algos import make_algorithm
from sao.rl.build import learner_config
from sao.rl.config import validate
from sao.rl.learner import Learner
from sao.rl.sources import SyncRollout
from sao.rl.sync import WeightSync
from sao.rl.tasks import TaskStream
from sao.rl.trainer import Trainer
from sao.rl.watched_sync import WatchedWeightSync
from tests.faults.procs import jsonl
from tests.test_train import FAST, config, responder, tiny_policy


class DyingEngine:
    """A managed engine over the scripted server (the watch's ``running``/``restart``/``stop``, and the
    control endpoints of a weight sync): dead while the server is killed; a restart brings it back serving
    the weights it was launched with (label ``default``), as a restarted vLLM does."""

    root_url = "http://fake"

    def __init__(self, server: FakeServer, *, die_at_reload: str | None = None):
        self.server, self.die_at_reload = server, die_at_reload
        self.version = "default"
        self.calls: list[str] = []
        self.restarts = 0

    @property
    def running(self) -> bool:
        return not self.server.dead

    def restart(self) -> None:
        self.server.restart()
        self.version = "default"
        self.restarts += 1
        self.calls.append("restart")

    def stop(self) -> None:
        pass

    def kill(self) -> None:
        self.server.kill()

    def _answer(self, what: str) -> None:
        if self.server.dead:
            raise EngineError(f"{what}: no answer (the engine died)")

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self._answer("pause")

    async def resume(self) -> None:
        self._answer("resume")

    async def reload_weights(self, path: Path, *, timeout_s: float | None = None) -> None:
        self._answer("reload")
        if Path(path).name == self.die_at_reload:
            self.die_at_reload = None
            self.kill()  # dies under the reload: the request gets no answer
            raise EngineError("POST /collective_rpc: no answer (connection reset)")
        self.calls.append(f"reload:{Path(path).name}")

    async def set_weight_version(self, version: int | str) -> None:
        self._answer("label")
        self.version = str(version)

    async def weight_version(self) -> str | None:
        self._answer("weight_info")
        return self.version

    async def reset_prefix_cache(self) -> bool:
        self._answer("reset_prefix_cache")
        return True


def killing_at(request_number: int, engine: list[DyingEngine]):  # type: ignore[no-untyped-def]
    """The scripted answers, slowed down so that episodes are in flight, and the engine killed when request
    ``request_number`` arrives (0: never)."""
    seen = {"n": 0}
    lock = threading.Lock()

    def respond(request: dict, prompt: str):  # type: ignore[no-untyped-def]
        with lock:
            seen["n"] += 1
            if seen["n"] == request_number:
                threading.Thread(target=engine[0].kill).start()
        reply = responder(request, prompt)
        from dataclasses import replace

        return replace(reply, delay_s=0.3)

    return respond


async def train(run_dir: Path, server: FakeServer, engine: DyingEngine) -> EngineWatch:
    cfg = config("grpo", max_steps=3)  # 2 prompts x 2 samples a step, one request an episode
    validate(cfg)
    learner = Learner(tiny_policy(), learner_config(cfg))
    client = OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST)
    sync = WatchedWeightSync(WeightSync(engine, run_dir / "weights", model_name="fake"))  # type: ignore[arg-type]
    async with EngineWatch(engine, WatchConfig(interval_s=0.05, max_restarts=2), on_restart=sync.restore) as watch:
        sync.watch = watch
        source = SyncRollout(client=client, renderer_for=lambda tools: ChatRenderer(ByteTokenizer(), tools),
                             engine=engine, env_name="arithmetic", env_kwargs=cfg.env.kwargs,
                             loop=LoopConfig(max_turns=1, max_tokens=cfg.env.max_tokens, max_model_len=400),
                             tasks=TaskStream("arithmetic", cfg.env.kwargs, cfg.seed), group_size=cfg.algo.group_size,
                             concurrency=4, seed=cfg.seed, watch=watch)
        trainer = Trainer(cfg, run_dir, learner=learner, algo=make_algorithm(cfg.algo), source=source,
                          weight_sync=sync, pad_id=257)
        await trainer.run()
        await client.aclose()
    return watch


@pytest.mark.parametrize("when", ["mid_rollout", "mid_sync"])
def test_a_dead_engine_is_restarted_resynced_and_the_run_completes_with_every_episode_once(when: str,
                                                                                          tmp_path: Path) -> None:
    holder: list[DyingEngine] = []
    # mid_rollout: request 6 of 12 is step 2's second episode; mid_sync: the reload of version 2
    with FakeServer(responder=killing_at(6 if when == "mid_rollout" else 0, holder)) as server:
        engine = DyingEngine(server, die_at_reload="v000002" if when == "mid_sync" else None)
        holder.append(engine)
        watch = asyncio.run(train(tmp_path, server, engine))

    assert watch.deaths == 1 and engine.restarts == 1
    rows = jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["engine/weight_version"] for r in rows] == [1, 2, 3]
    # the restarted engine loads what it served before anything runs on it, then the run goes on
    after = engine.calls[engine.calls.index("restart") + 1:]
    assert after == ["reload:v000001", "reload:v000002", "reload:v000003"], engine.calls
    trajectories = jsonl(tmp_path / "trajectories.jsonl")
    assert all(t["status"] == "ok" for t in trajectories)
    assert Counter(t["rollout"]["train_step"] for t in trajectories) == {1: 4, 2: 4, 3: 4}  # none lost
    episodes = [(t["rollout"]["train_step"], t["task_id"], t["sample"]) for t in trajectories]
    assert len(set(episodes)) == len(episodes)  # none recorded twice
    prompts = [e["prompt_index"] for b in jsonl(tmp_path / "batches.jsonl") for e in b["episodes"]]
    assert sorted(prompts) == [i for i in range(6) for _ in range(2)]
