"""``sao-eval --replicas 2`` on two real vLLM engines with the bundled model (issue 11, WAR routing).

The pieces ``evaluate`` runs (:func:`~sao.evals.engines.open_engines`, :func:`~sao.evals.engines.measured`,
:func:`~sao.evals.runner.run_pairs`) play multi-turn arithmetic episodes (one feedback turn after a wrong
answer) over two managed engines with the cache-aware router. Replica 0's API server is SIGKILLed
after a few episodes, with no restart allowed: the rest runs on replica 1, no episode fails, and both
engines' process groups are gone at the end. The summary's prefix-cache hit rate is summed over both.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from sao.agents.store import TrajectoryWriter, read_trajectories
from sao.evals.engines import measured, open_engines
from sao.evals.runner import EvalConfig, plan, run_pairs
from tests.conftest import _require

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.long]


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_real_replicas_route_turns_to_their_prefix_and_survive_a_killed_one(tmp_path, smollm2_dir, monkeypatch):
    # vLLM's CPU backend caches prefixes in blocks of 128 tokens: a sampled first turn shorter than that
    # leaves nothing to hit (two runs read a hit rate of 0.0). Blocks of 32 make a hit certain: the
    # prompt alone fills one, and a later turn on the same replica starts with it.
    monkeypatch.setenv("SAO_VLLM_ARGS", "--block-size 32")
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        _require("vLLM", f"it does not import ({exc})")
    cfg = EvalConfig(benchmark="arithmetic", output=tmp_path, limit=8, samples=2,
                     concurrency=4, max_tokens=192, max_turns=3, max_model_len=2048, max_restarts=0, replicas=2,
                     router="cache_aware", env_args={"feedback_turns": 1, "difficulty": 0.6})
    ids, env_kwargs = plan(cfg)
    pairs = [(t, s) for t in ids for s in range(cfg.samples)]
    done = {"n": 0}
    pids: list[int] = []

    def on_done(t) -> None:  # type: ignore[no-untyped-def]
        done["n"] += 1
        if done["n"] == 4:  # the API server only, as a crash would: its EngineCore is left to the run
            os.kill(pids[0], signal.SIGKILL)

    with open_engines(cfg) as endpoints, TrajectoryWriter(tmp_path / "trajectories.jsonl") as writer:
        assert len(endpoints) == 2 and endpoints[0].base_url != endpoints[1].base_url
        pids += [e.server.pid for e in endpoints]  # type: ignore[union-attr]
        engine = asyncio.run(measured(cfg, endpoints, lambda: run_pairs(cfg, endpoints, env_kwargs, pairs, writer,
                                                                         on_done)))
    trajectories = read_trajectories(tmp_path / "trajectories.jsonl")
    assert len(trajectories) == 16 and len({(t.task_id, t.sample) for t in trajectories}) == 16
    assert all(t.status == "ok" for t in trajectories), [t.error for t in trajectories if t.status != "ok"]
    assert engine is not None and engine["replicas"] == 2 and engine["router"] == "cache_aware"
    routing = engine["routing"]
    assert routing["later_turns"] > 0  # SmolLM2 misses some: their feedback turn is a later turn
    # a later turn leaves its replica only when that one died under the episode (at most those in flight)
    assert routing["moved_turns"] <= cfg.concurrency
    assert routing["requests_per_replica"][1] > routing["requests_per_replica"][0]
    assert engine["prefix_cache_hit_rate"] is not None and engine["prefix_cache_hit_rate"] > 0
    assert not any(_group_alive(pid) for pid in pids)  # every engine's process group is gone
