"""The scheduled rollout modes on (scripted) engine replicas, under the real trainer.

Two scripted HTTP servers stand for two vLLM replicas (answers delayed by a seed-dependent time, so
trajectories finish out of order and weights change under running ones), recording fakes for their
control endpoints, a tiny random Llama as the policy. Checked: the contract's rollout keys on every
step, staleness within k, nothing lost, failed attempts re-queued, and that pipe trains on-policy.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from sao.agents import ByteTokenizer, EpisodeRunner, LoopConfig, OpenAICompletionClient, Renderers, RetryPolicy
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.rl.algos import make_algorithm
from sao.rl.learner.learner import Learner
from sao.rl.learner.value_model import ValueModel
from sao.rl.prompts.curriculum import ScheduledTaskStream
from sao.rl.prompts.tasks import TaskStream
from sao.rl.rollout.orchestrated import HealthConfig, OrchestratedRollout, Replica
from sao.rl.rollout.schedulers import SchedulerConfig
from sao.rl.training.build import learner_config
from sao.rl.training.trainer import Trainer
from sao.rl.weights.sync import WeightPublisher
from test_train import FakeEngine, _answer, config, lines, responder, tiny_policy


def slow_responder(request: dict, prompt: str) -> Reply:
    reply = responder(request, prompt)
    seed = int(request.get("seed") or 0)
    return Reply(text=reply.text, logprob=reply.logprob, delay_s=0.02 * (seed % 7))


def make_async_trainer(mode: str, algo: str, run_dir: Path, servers: list[FakeServer], engines: list[FakeEngine],
                       *, staleness: int = 1, max_steps: int = 3, policy: str = "drop", resume: bool = False,
                       health: HealthConfig = HealthConfig(), restarts: dict[int, Any] | None = None,
                       keep_kv: bool = False, schedule: Any = None, **sched_kw: Any) -> Trainer:
    cfg = config(algo, max_steps=max_steps, keep_checkpoints=1, resume=resume,
                 **({"schedule": schedule} if schedule is not None else {}))
    algorithm = make_algorithm(cfg.algo)
    model = tiny_policy()
    learner = Learner(model, learner_config(cfg), value_model=ValueModel.from_policy(model) if algorithm.uses_critic else None)
    tasks: Any = (TaskStream("arithmetic", cfg.env.kwargs, cfg.seed) if schedule is None
                  else ScheduledTaskStream("arithmetic", cfg.env.kwargs, cfg.seed, schedule))
    retry = RetryPolicy(max_retries=0, backoff_s=0.01, max_backoff_s=0.01)
    replicas = [Replica(OpenAICompletionClient(s.base_url, "fake", timeout_s=10, retry=retry), e,
                        alive=lambda s=s: not s.dead, restart=(restarts or {}).get(i))
                for i, (s, e) in enumerate(zip(servers, engines))]

    runner = EpisodeRunner("arithmetic", Renderers(ByteTokenizer()), LoopConfig(max_turns=1, max_tokens=48,
                                                                                max_model_len=400), cfg.env.kwargs)

    async def play(client, ref, sample, seed):  # type: ignore[no-untyped-def]
        return await runner(client, task_id=ref.task_id, sample=sample, seed=seed)

    sched = SchedulerConfig(batch_size=cfg.batch_size, group_size=cfg.algo.group_size, max_concurrency=4,
                            staleness=staleness, stale_policy=policy, **sched_kw)
    source = OrchestratedRollout(mode, sched, replicas, tasks=tasks, run_episode=play,
                                 weights_root=run_dir / "weights", seed=cfg.seed, health=health, keep_kv=keep_kv)
    return Trainer(cfg, run_dir, learner=learner, algo=algorithm, source=source,
                   weight_sync=WeightPublisher(run_dir / "weights"), pad_id=257,
                   tasks=tasks if schedule is not None else None)


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
        assert r["rollout/len_trained_n"] > 0 and r["rollout/len_generated_mean"] > 0  # length bias (C2) is logged
    # every replica was synced to new versions from the published folders
    assert all(any(c.startswith("reload:v") for c in e.calls) for e in engines)
    trained = [t for t in lines(tmp_path / "trajectories.jsonl")]
    assert len(trained) >= 12  # 3 steps x 4, plus re-queued and still-running attempts


@pytest.mark.parametrize("keep_kv", [False, True])
def test_each_version_load_clears_the_kv_cache_unless_keep_kv(tmp_path: Path, servers, keep_kv: bool) -> None:  # type: ignore[no-untyped-def]
    """rollout.keep_kv: whether a load lets the requests in flight keep their KV blocks (sao.rl.weights.load)."""
    engines = [FakeEngine(), FakeEngine()]
    trainer = make_async_trainer("async", "sao", tmp_path, servers, engines, max_steps=2, keep_kv=keep_kv)
    asyncio.run(trainer.run())
    assert all(len(e.cleared) >= 2 and set(e.cleared) == {not keep_kv} for e in engines)  # start version + updates


def test_pipe_trains_grpo_groups_on_policy(tmp_path: Path, servers) -> None:  # type: ignore[no-untyped-def]
    trainer = make_async_trainer("pipe", "grpo", tmp_path, servers, [FakeEngine(), FakeEngine()], max_steps=2)
    asyncio.run(trainer.run())
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/batch_staleness_max"] == 0 and r["rollout/lost"] == 0 for r in rows)
    # CGP: each complete group reached the learner as its own part (4 trajectories = 2 groups of 2)
    assert all(r["policy/parts"] == 2 for r in rows)


def test_forgetting_probes_run_in_a_scheduled_mode_and_are_never_trained(tmp_path: Path, servers) -> None:  # type: ignore[no-untyped-def]
    """An online schedule's probes (every family seen, each step) beside async training over two replicas:
    recorded as probes, on a replica's newest version, never in a trained batch."""
    from sao.rl.config import ScheduleConfig

    schedule = ScheduleConfig(kind="phases", eval_every=1, eval_prompts=2,
                              phases=[{"families": ["add"], "steps": 1}, {"families": ["mul"]}])
    trainer = make_async_trainer("async", "sao", tmp_path, servers, [FakeEngine(), FakeEngine()], max_steps=3,
                                 staleness=1, schedule=schedule)
    asyncio.run(trainer.run())
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "probe/family/add" in rows[0] and "probe/family/mul" not in rows[0]  # only add seen at step 1
    assert all("probe/family/add" in r and "probe/family/mul" in r for r in rows[1:])
    assert all(0 <= r["probe/version_lag"] <= 1 for r in rows)  # a replica may still serve the version before
    probes = [t for t in lines(tmp_path / "trajectories.jsonl") if t["rollout"]["probe"]]
    assert len(probes) == 2 + 4 + 4  # 2 prompts x families seen, at steps 1, 2, 3
    assert all(t["rollout"]["replica"] in (0, 1) for t in probes)
    trained = {e["prompt_index"] for e in trained_episodes(tmp_path)}
    assert len(trained) >= 4 and not trained & {t["rollout"]["prompt_index"] for t in probes}


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_an_engine_that_fails_every_request_stops_the_run_with_the_cause(mode: str, tmp_path: Path) -> None:
    """The replicas live (their /health answers) but every completion is an error: the scheduler would
    re-queue and replace the prompts forever; the run stops once a batch's worth of requests, each failed
    max_failures (3) times, failed in a row, naming the cause, and every attempt is recorded. (No critic:
    its pretraining batch would stop the run first, with the trainer's own all-failed error.)"""
    def broken(request: dict, prompt: str) -> Reply:
        return Reply(status=500, error="engine on fire")

    with FakeServer(responder=broken) as a, FakeServer(responder=broken) as b:
        trainer = make_async_trainer(mode, "reinforce_mean" if mode == "async" else "grpo", tmp_path, [a, b],
                                     [FakeEngine(), FakeEngine()], max_steps=2)
        with pytest.raises(RuntimeError, match=r"the last 12 attempts all failed .*engine on fire"):
            asyncio.run(asyncio.wait_for(trainer.run(), 120))
    recorded = lines(tmp_path / "trajectories.jsonl")
    assert len(recorded) >= 12 and all(t["status"] == "failed" and "engine on fire" in t["error"] for t in recorded)
    assert not (tmp_path / "metrics.jsonl").exists() or not lines(tmp_path / "metrics.jsonl")  # no step was taken


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
    final = trainer.source.stats()  # episodes go on after the last step's row
    assert final["rollout/lost"] == 0
    # Every failed record is in the ledger: re-queued, failed, or still in flight there when its episode
    # wrote the record but the run stopped before the loop read its TrajectoryFinished event.
    ledger = trainer.source.scheduler.book.ledger  # type: ignore[attr-defined]  # the async mode's book
    unread = [t for t in failed if (a := ledger.get(t["rollout"]["traj_id"])) is not None and a.state.value == "in_flight"]
    assert ledger.counts["requeued"] + ledger.counts["failed"] + len(unread) >= len(failed)


class AbortingEngine(FakeEngine):
    """A replica's control endpoints whose pause in "abort" mode aborts what its server runs, as vLLM's
    does (FakeServer.abort: each request answers at once with half its tokens, finish_reason "abort")."""

    def __init__(self, server: FakeServer) -> None:
        super().__init__()
        self.server = server

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        await super().pause(mode=mode, clear_cache=clear_cache)
        self.calls[-1] = f"pause:{mode}"
        if mode == "abort":
            self.server.abort()


def answering(logprob: float):  # type: ignore[no-untyped-def]
    """Always the right answer, or its rest when the prompt already ends with a start of it (a moved
    request's continuation); every second question is a straggler (3 s), the rest take 0.05 s. A straggler
    must still be running when a step ends: the update took 0.14 s alone and 0.6-0.9 s under load, and a CI
    run with stragglers of 0.8 s made no move."""
    def respond(request: dict, prompt: str) -> Reply:
        full = f"The answer is \\boxed{{{_answer(prompt)}}}."
        said = prompt.rsplit("assistant\n", 1)[-1]
        if said and full.startswith(said):
            return Reply(text=full[len(said):], logprob=logprob, delay_s=0.05)
        return Reply(text=full, logprob=logprob, delay_s=3.0 if _answer(prompt) % 2 else 0.05)
    return respond


def test_multi_version_rebalancing_moves_running_requests_with_their_partial_tokens(tmp_path: Path) -> None:
    """rollout=multi_version with rebalance on two scripted replicas: after a step, a draining replica
    of the old version with at most 2 of 4 slots busy moves its stragglers to its peer; the driver aborts
    it (its engine's pause in "abort" mode) and each aborted request goes on on the peer from the tokens
    it had. The replicas report different log-probs (-0.5 and -0.9): a moved turn holds both, is the
    whole right answer once, and is of one version. Nothing lost, staleness within k."""
    with FakeServer(responder=answering(-0.5)) as a, FakeServer(responder=answering(-0.9)) as b:
        engines = [AbortingEngine(a), AbortingEngine(b)]
        trainer = make_async_trainer("multi_version", "sao", tmp_path, [a, b], engines, staleness=1, max_steps=4,
                                     rebalance=True, drain_below=0.5)
        asyncio.run(trainer.run())
        aborted = a.aborted + b.aborted
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/lost"] == 0 and r["rollout/staleness_max"] <= 1 for r in rows)
    final = trainer.source.stats()
    assert final["rollout/lost"] == 0
    assert final["multi_version/moves"] >= 1 and final["rollout/moved"] >= 1, final
    assert final["rollout/moved_requests"] >= 1 and aborted >= 1, final  # some moved mid-request
    assert any(c == "pause:abort" for e in engines for c in e.calls)  # the source was aborted, then loaded
    moved = [t for t in lines(tmp_path / "trajectories.jsonl") if t["status"] == "ok"
             and {-0.5, -0.9} <= {round(lp, 3) for lp, m in zip(t["logprobs"], t["action_mask"]) if m}]
    assert moved, "no recorded turn was sampled on both replicas"
    for t in moved:
        (turn,) = t["turns"]
        sampled = bytes(i for i, m in zip(t["token_ids"], t["action_mask"]) if m and i < 256).decode()
        assert sampled.count("The answer is") == 1 and t["reward"] == 1.0, sampled  # partial + rest, once
        assert len({v for v, _ in turn["token_versions"]}) == 1 == len(set(turn["policy_versions"].values()))


def trained_episodes(run_dir: Path) -> list[dict[str, Any]]:
    """Every episode the learner trained on, from batches.jsonl, with its step."""
    return [{**e, "step": row["step"]} for row in lines(run_dir / "batches.jsonl") for e in row["episodes"]]


def test_a_replica_that_dies_mid_run_is_restarted_and_nothing_is_lost(tmp_path: Path) -> None:
    """Replica 1 crashes (its in-flight requests get no answer, new ones are refused) after 10
    requests; the watcher sees it, the scheduler re-queues its attempts, it is restarted on the same
    port and synced to the newest version before it serves again."""
    b = FakeServer(responder=slow_responder)
    seen = {"n": 0}

    def crashing(request: dict, prompt: str) -> Reply:
        seen["n"] += 1
        if seen["n"] == 10:
            threading.Thread(target=b.kill).start()
        return slow_responder(request, prompt)

    b.responder = crashing

    async def restart_b() -> None:
        await asyncio.sleep(0.3)  # a restart takes a while; work goes on on replica 0
        await asyncio.to_thread(b.restart)

    engines = [FakeEngine(), FakeEngine()]
    with FakeServer(responder=slow_responder) as a, b:
        trainer = make_async_trainer("async", "sao", tmp_path, [a, b], engines, staleness=1, max_steps=4,
                                     health=HealthConfig(interval_s=0.05, failures=2, timeout_s=1.0),
                                     restarts={1: restart_b})
        asyncio.run(trainer.run())
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/lost"] == 0 and r["rollout/staleness_max"] <= 1 for r in rows)
    final = trainer.source.stats()
    assert final["rollout/replica_deaths"] == 1 and final["rollout/replica_restarts"] == 1
    assert final["rollout/lost"] == 0 and final["rollout/requeued"] >= 1  # its in-flight attempts came back
    reloads = [c for c in engines[1].calls if c.startswith("reload:")]
    assert len(reloads) >= 2  # the start version, then the newest version after the restart
    episodes = trained_episodes(tmp_path)
    assert len(episodes) == 16
    assert len({e["prompt_index"] for e in episodes}) == 16  # no prompt trained twice
    assert all(e["step"] - 1 - e["policy_version"] <= 1 for e in episodes)  # staleness <= k per trained episode


def test_a_replica_that_cannot_be_restarted_stops_the_run_with_the_cause(tmp_path: Path, servers) -> None:  # type: ignore[no-untyped-def]
    a, b = servers
    calls = {"n": 0}

    async def broken_restart() -> None:
        calls["n"] += 1
        raise OSError("no memory to start vLLM")

    b.kill()
    trainer = make_async_trainer("async", "reinforce_mean", tmp_path, [a, b], [FakeEngine(), FakeEngine()],
                                 health=HealthConfig(interval_s=0.05, failures=1, timeout_s=1.0, max_restarts=2),
                                 restarts={1: broken_restart}, max_steps=50)
    with pytest.raises(RuntimeError, match="max_restarts=2 restarts used up"):
        asyncio.run(trainer.run())
    assert calls["n"] == 2


@pytest.mark.parametrize("mode,algo", [("async", "sao"), ("pipe", "grpo")])
def test_resuming_mid_run_neither_loses_nor_retrains_a_prompt(mode: str, algo: str, tmp_path: Path, servers) -> None:  # type: ignore[no-untyped-def]
    """Stop after step 2 with prompts in flight and finished-untrained; resume to step 4. The
    scheduler starts at version 2, the checkpoint's open prompts are admitted first, and across both
    runs every prompt is trained at most once."""
    first = make_async_trainer(mode, algo, tmp_path, servers, [FakeEngine(), FakeEngine()], max_steps=2)
    asyncio.run(first.run())
    state = json.loads((tmp_path / "checkpoints" / "step_000002" / "state.json").read_text())
    open_at_2 = {r["index"] for r in state["source"]["open"]}
    if mode == "async":  # the engines never wait for the learner: work was in flight at the checkpoint
        assert open_at_2
    engines = [FakeEngine(), FakeEngine()]
    second = make_async_trainer(mode, algo, tmp_path, servers, engines, max_steps=4, resume=True)
    asyncio.run(second.run())
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert all(e.calls[:2] == ["pause", "reload:v000002"] for e in engines), [e.calls[:4] for e in engines]  # version 2 first
    episodes = trained_episodes(tmp_path)
    keys = [(e["prompt_index"], e["sample"]) for e in episodes]
    assert len(keys) == len(set(keys)) == 4 * 4  # nothing trained twice
    before = {e["prompt_index"] for e in episodes if e["step"] <= 2}
    after = {e["prompt_index"] for e in episodes if e["step"] > 2}
    assert not before & open_at_2
    still_open = {r.index for r in second.source._prompts.open()}
    failed = {t["rollout"]["prompt_index"] for t in lines(tmp_path / "trajectories.jsonl") if t["status"] != "ok"}
    assert open_at_2 <= after | still_open | failed  # none lost
    if mode == "async":
        assert open_at_2 & after  # re-admitted first, so trained in the resumed steps
    rows = lines(tmp_path / "metrics.jsonl")
    assert all(r["rollout/lost"] == 0 for r in rows)
    # the run's counts and lengths go on across the resume instead of starting again from zero
    assert [r["rollout/trained"] for r in rows] == [r["rollout/len_trained_n"] for r in rows] == [4, 8, 12, 16]
    assert rows[2]["rollout/admitted"] >= rows[1]["rollout/admitted"] - len(open_at_2) + 4


def test_what_a_replica_serves_is_written_only_by_the_events_applied_to_it() -> None:
    """The one record of a replica's version: a load's ``Served`` sets it, a death makes it unknown, and only
    on a replica the learner pushed into does a load of the version it serves find nothing to do."""
    from sao.rl.rollout.schedulers import UNKNOWN_VERSION, ReplicaDied
    from sao.rl.rollout.served import ServedVersions
    from sao.rl.weights import Served

    versions = ServedVersions(2)
    assert [versions[0], versions[1]] == [0, 0] and versions.live(set()) == [0, 0]
    versions.apply(Served(1, 3))
    assert versions[1] == 3 and not versions.pushed(1, 3)  # the driver's own load: a later load of 3 loads again
    versions.apply(Served(0, 2, pushed=True))
    assert versions.pushed(0, 2) and not versions.pushed(0, 3)
    versions.apply(ReplicaDied(0, "gone"))
    assert versions[0] == UNKNOWN_VERSION and not versions.pushed(0, 2)  # a restarted engine serves what it launched with
    assert versions.live({0}) == [3] and versions.live({0, 1}) == [UNKNOWN_VERSION]
    with pytest.raises(TypeError, match="not an event"):
        versions.apply("v3")  # type: ignore[arg-type]


def test_a_push_reports_what_it_made_the_replica_serve_and_is_made_again_after_a_death() -> None:
    """``rollout=sync``'s push writes nothing of the driver's: it reports ``Served(rid, v, pushed=True)``,
    and a push that the replica's death cut is made again once the driver says it is back."""
    from sao.rl.weights import ReplicaWeightSync, Served

    class Target:
        def __init__(self) -> None:
            self.events: list[Served] = []
            self.life = 0

        def generation(self, rid: int) -> int:
            return self.life

        async def back_since(self, rid: int, generation: int) -> bool:
            self.life += 1
            return True

        def apply(self, event: Served) -> None:
            self.events.append(event)

    class Inner:
        calls = 0

        async def sync(self, model: Any, version: int, *, probe: bool = True, recent: Any = ()) -> dict[str, float]:
            Inner.calls += 1
            if Inner.calls == 1:
                raise ConnectionError("the engine died mid-push")
            return {"perf/sync_s": 0.1}

    target = Target()
    sync = ReplicaWeightSync(Inner(), target, rid=1)  # type: ignore[arg-type]
    assert asyncio.run(sync.sync(None, 4)) == {"perf/sync_s": 0.1}  # type: ignore[arg-type]
    assert Inner.calls == 2 and target.events == [Served(1, 4, pushed=True)]
