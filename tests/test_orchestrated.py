"""The scheduled rollout modes on (scripted) engine replicas, under the real trainer.

Two scripted HTTP servers stand for two vLLM replicas (answers delayed by a seed-dependent time, so
trajectories finish out of order and weights change under running ones), recording fakes for their
control endpoints, a tiny random Llama as the policy. Checked: the contract's rollout keys on every
step, staleness within k, nothing lost, failed attempts re-queued, and that pipe trains on-policy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sao.agents import ByteTokenizer, ChatRenderer, LoopConfig, OpenAICompletionClient, RetryPolicy, run_episode
from sao.agents.fake_server import FakeServer, Reply
from sao.envs import make
from sao.rl.algos import make_algorithm
from sao.rl.build import learner_config
from sao.rl.learner import Learner
from sao.rl.orchestrated import OrchestratedRollout, Replica
from sao.rl.rollout import SchedulerConfig
from sao.rl.sync import WeightPublisher
from sao.rl.tasks import TaskStream
from sao.rl.trainer import Trainer
from sao.rl.value import ValueModel
from test_train import FakeEngine, config, lines, responder, tiny_policy


def slow_responder(request: dict, prompt: str) -> Reply:
    reply = responder(request, prompt)
    seed = int(request.get("seed") or 0)
    return Reply(text=reply.text, logprob=reply.logprob, delay_s=0.02 * (seed % 7))


def make_async_trainer(mode: str, algo: str, run_dir: Path, servers: list[FakeServer], engines: list[FakeEngine],
                       *, staleness: int = 1, max_steps: int = 3, policy: str = "drop") -> Trainer:
    cfg = config(algo, max_steps=max_steps, keep_checkpoints=1)
    algorithm = make_algorithm(cfg.algo)
    model = tiny_policy()
    learner = Learner(model, learner_config(cfg), value_model=ValueModel.from_policy(model) if algorithm.uses_critic else None)
    tasks = TaskStream("arithmetic", cfg.env.kwargs, cfg.seed)
    retry = RetryPolicy(max_retries=0, backoff_s=0.01, max_backoff_s=0.01)
    replicas = [Replica(OpenAICompletionClient(s.base_url, "fake", timeout_s=10, retry=retry), e)
                for s, e in zip(servers, engines)]

    async def play(client, ref, sample, seed):  # type: ignore[no-untyped-def]
        env = make("arithmetic", **cfg.env.kwargs)
        try:
            return await run_episode(env, client, ChatRenderer(ByteTokenizer()),
                                     LoopConfig(max_turns=1, max_tokens=48, max_model_len=400),
                                     env_name="arithmetic", task_id=ref.task_id, sample=sample, seed=seed)
        finally:
            env.close()

    sched = SchedulerConfig(batch_size=cfg.batch_size, group_size=cfg.algo.group_size, max_concurrency=4,
                            staleness=staleness, stale_policy=policy)
    source = OrchestratedRollout(mode, sched, replicas, tasks=tasks, run_episode=play,
                                 weights_root=run_dir / "weights", seed=cfg.seed)
    return Trainer(cfg, run_dir, learner=learner, algo=algorithm, source=source,
                   weight_sync=WeightPublisher(run_dir / "weights"), pad_id=257)


@pytest.fixture
def servers():  # type: ignore[no-untyped-def]
    with FakeServer(responder=slow_responder) as a, FakeServer(responder=slow_responder) as b:
        yield [a, b]


@pytest.mark.parametrize("mode", ["async", "multi_version", "one_step_off"])
def test_single_rollout_modes_train_within_the_staleness_bound(mode: str, tmp_path: Path, servers) -> None:  # type: ignore[no-untyped-def]
    engines = [FakeEngine(), FakeEngine()]
    trainer = make_async_trainer(mode, "sao", tmp_path, servers, engines, staleness=1)
    asyncio.run(trainer.run())
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("rollout/staleness_max", "rollout/lost", "rollout/requeued"):
            assert r[key] is not None, key
        assert r["rollout/lost"] == 0
        assert r["rollout/batch_staleness_max"] <= 1
        assert r["rollout/staleness_max"] <= 1
    # every replica was synced to new versions from the published folders
    assert all(any(c.startswith("reload:v") for c in e.calls) for e in engines)
    trained = [t for t in lines(tmp_path / "trajectories.jsonl")]
    assert len(trained) >= 12  # 3 steps x 4, plus re-queued and still-running attempts


def test_pipe_trains_grpo_groups_on_policy(tmp_path: Path, servers) -> None:  # type: ignore[no-untyped-def]
    trainer = make_async_trainer("pipe", "grpo", tmp_path, servers, [FakeEngine(), FakeEngine()], max_steps=2)
    asyncio.run(trainer.run())
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/batch_staleness_max"] == 0 and r["rollout/lost"] == 0 for r in rows)


def test_failed_attempts_are_requeued_not_lost(tmp_path: Path) -> None:
    calls = {"n": 0}

    def flaky(request: dict, prompt: str) -> Reply:
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            return Reply(status=500, error="replica hiccup")
        return slow_responder(request, prompt)

    with FakeServer(responder=flaky) as a, FakeServer(responder=slow_responder) as b:
        trainer = make_async_trainer("async", "sao", tmp_path, [a, b], [FakeEngine(), FakeEngine()], max_steps=2,
                                     staleness=2)
        asyncio.run(trainer.run())
    rows = lines(tmp_path / "metrics.jsonl")
    assert all(r["rollout/lost"] == 0 for r in rows)
    failed = [t for t in lines(tmp_path / "trajectories.jsonl") if t["status"] == "failed"]
    assert failed and all("replica hiccup" in t["error"] for t in failed)  # recorded with the cause
    assert rows[-1]["rollout/requeued"] >= len(failed)


def test_resuming_an_async_run_says_it_is_not_supported_yet(tmp_path: Path, servers) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    asyncio.run(make_async_trainer("async", "reinforce_mean", tmp_path, servers, [FakeEngine(), FakeEngine()],
                                   max_steps=1).run())
    trainer = make_async_trainer("async", "reinforce_mean", tmp_path, servers, [FakeEngine(), FakeEngine()],
                                 max_steps=2)
    trainer.cfg = replace(trainer.cfg, resume=True)
    with pytest.raises(NotImplementedError, match="not supported yet"):
        asyncio.run(trainer.run())
