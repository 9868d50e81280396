"""``rollout=sync`` training whose managed engine dies, with scripted parts (seconds): a tiny policy, the
scripted server as the engine, which dies mid-rollout or mid-sync. The run's one replica is watched and
restarted by the rollout driver (:mod:`sao.rl.rollout.replica_health`), as in every mode. The run completes: the
episodes the death cut are re-queued and run again from their start (each trained once), the restarted
engine is given the version it served before it samples again, and a cut sync is made again.
Against the real vLLM: ``test_train_faults.py::test_sync_training_restarts_a_killed_engine``."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import pytest

from sao.agents import OpenAICompletionClient
from sao.agents.errors import EngineError
from sao.agents.testing.fake_server import FakeServer
from sao.rl.algos import make_algorithm
from sao.rl.config import validate
from sao.rl.learner.learner import Learner
from sao.rl.learner.value_model import ValueModel
from sao.rl.prompts.tasks import TaskStream
from sao.rl.rollout.orchestrated import HealthConfig, OrchestratedRollout
from sao.rl.training.build import learner_config
from sao.rl.training.trainer import Trainer
from sao.rl.weights.replica_sync import ReplicaWeightSync
from sao.rl.weights.sync import WeightSync
from tests.faults.procs import jsonl
from tests.test_train import FAST, config, responder, sync_source, tiny_policy


class DyingEngine:
    """A managed engine over the scripted server (``running``/``restart``, and the control endpoints of a
    replica: a weight load's and ``/health``): dead while the server is killed; a restart brings it back
    serving the weights it was launched with (label ``default``), as a restarted vLLM does."""

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

    async def health(self) -> bool:
        return not self.server.dead


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


async def train(run_dir: Path, server: FakeServer, engine: DyingEngine, algo: str = "grpo") -> OrchestratedRollout:
    cfg = config(algo, max_steps=3)  # grpo: 2 prompts x 2 samples a step; sao: 4 prompts; one request an episode
    validate(cfg)
    policy = tiny_policy()
    value = ValueModel.from_policy(policy) if algo == "sao" else None
    learner = Learner(policy, learner_config(cfg), value_model=value)
    client = OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST)

    async def restart() -> None:
        engine.restart()

    source = sync_source(cfg, run_dir, client, engine, TaskStream("arithmetic", cfg.env.kwargs, cfg.seed),
                         health=HealthConfig(interval_s=0.05, max_restarts=2), restart=restart,
                         alive=lambda: engine.running)
    # two versions kept: a restarted engine first reloads the one before the version being pushed
    sync = ReplicaWeightSync(WeightSync(engine, run_dir / "weights", model_name="fake", keep=2), source)  # type: ignore[arg-type]
    trainer = Trainer(cfg, run_dir, learner=learner, algo=make_algorithm(cfg.algo), source=source,
                      weight_sync=sync, pad_id=257)
    try:
        await trainer.run()
    finally:
        await source.aclose()
        await client.aclose()
    return source


@pytest.mark.parametrize("when", ["mid_rollout", "mid_sync", "mid_warmup"])
def test_a_dead_engine_is_restarted_resynced_and_the_run_completes_with_every_episode_once(when: str,
                                                                                          tmp_path: Path) -> None:
    """mid_rollout: request 6 of 12 is step 2's second episode; mid_sync: the reload of version 2; mid_warmup
    (SAO, whose critic first pretrains on a batch of 4 outside the schedule): request 2 of that batch."""
    holder: list[DyingEngine] = []
    kill_at = {"mid_rollout": 6, "mid_sync": 0, "mid_warmup": 2}[when]
    with FakeServer(responder=killing_at(kill_at, holder)) as server:
        engine = DyingEngine(server, die_at_reload="v000002" if when == "mid_sync" else None)
        holder.append(engine)
        source = asyncio.run(train(tmp_path, server, engine, "sao" if when == "mid_warmup" else "grpo"))

    assert source.stats()["rollout/replica_deaths"] == 1 and engine.restarts == 1
    rows = jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["engine/weight_version"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/lost"] == 0 for r in rows)
    # the restarted engine loads what it served before anything runs on it, then the run goes on
    after = engine.calls[engine.calls.index("restart") + 1:]
    served = ["reload:v000000"] if when == "mid_warmup" else []
    assert after == [*served, "reload:v000001", "reload:v000002", "reload:v000003"], engine.calls
    trajectories = jsonl(tmp_path / "trajectories.jsonl")
    ok = [t for t in trajectories if t["status"] == "ok" and not t["rollout"]["warmup"]]
    assert Counter(t["rollout"]["train_step"] for t in ok) == {1: 4, 2: 4, 3: 4}  # none lost
    episodes = [(t["rollout"]["train_step"], t["task_id"], t["sample"]) for t in ok]
    assert len(set(episodes)) == len(episodes)  # none trained twice
    # a scheduled attempt that the death cut was cancelled and re-queued (it ran again from its start)
    assert (rows[-1]["rollout/requeued"] >= 1) == (when == "mid_rollout")  # nothing was in flight under the sync
    warm = [t for t in trajectories if t["rollout"]["warmup"]]
    if when == "mid_warmup":  # a warm-up episode the death cut is recorded failed, and played again
        cut = [t for t in warm if t["status"] != "ok"]
        assert cut and all(t["rollout"]["attempt"] == 0 for t in cut)
        assert len([t for t in warm if t["status"] == "ok"]) == 4
        assert {t["task_id"] for t in cut} <= {t["task_id"] for t in warm if t["status"] == "ok" and t["rollout"]["attempt"] == 1}
        pretrain = jsonl(tmp_path / "value_pretrain.jsonl")[0]  # the critic trained on the whole batch
        assert pretrain["rollout/trajectories"] == 4 and pretrain["rollout/failed"] == 0
    assert all(t["status"] == "ok" for t in trajectories if not t["rollout"]["warmup"])
    if when != "mid_warmup":
        prompts = [e["prompt_index"] for b in jsonl(tmp_path / "batches.jsonl") for e in b["episodes"]]
        assert sorted(prompts) == [i for i in range(6) for _ in range(2)]
