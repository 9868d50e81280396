"""The routing completion client over several replicas (agents/routing/client.py), the engine meter
(agents/engine/meter.py) and ``sao-eval --replicas`` (evals/), with scripted fakes: replicas that
answer, hang or die, ``/metrics`` that answers, fails or restarts from zero."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from sao.agents import Completion, SamplingParams
from sao.agents.engine.meter import EngineMeter
from sao.agents.engine.metrics import EngineMetrics, combined
from sao.agents.engine.watch import EngineRestartsExhausted, EngineWatch, WatchConfig
from sao.agents.errors import EngineError
from sao.agents.routing.client import RoutedReplica, RoutingClient
from sao.agents.routing.routers import CacheAware, RoundRobin
from sao.rl.training.engine_step import StepEngineMetrics, engine_step_metrics

PARAMS = SamplingParams(max_tokens=4)


class Replica:
    """A scripted replica: completions (3 tokens after ``delay_s``; ``hang`` holds them until set),
    ``/metrics`` readings (``load`` as running requests; ``fail`` makes a read raise) and a process
    (``running``; ``restart`` brings it back)."""

    def __init__(self, *, load: int = 0, delay_s: float = 0.0):
        self.load, self.delay_s = load, delay_s
        self.prompts: list[tuple[int, ...]] = []
        self.reads = 0
        self.fail = False
        self.running = True
        self.restarts = 0
        self.hang: asyncio.Event | None = None

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.prompts.append(tuple(prompt_ids))
        if self.hang is not None:
            await self.hang.wait()
        await asyncio.sleep(self.delay_s)
        return Completion((7, 8, 9), (-0.1, -0.1, -0.1), "abc", "stop")

    async def metrics(self) -> EngineMetrics:
        self.reads += 1
        if self.fail:
            raise EngineError("GET /metrics: ConnectError")
        return EngineMetrics(running=self.load)

    def restart(self) -> None:
        self.restarts += 1
        self.running = True

    def stop(self) -> None:
        self.running = False


def routed(replicas: list[Replica], router, watches: list[EngineWatch | None] | None = None) -> RoutingClient:
    watches = watches or [None] * len(replicas)
    return RoutingClient([RoutedReplica(r, r, w) for r, w in zip(replicas, watches)], router, grace_s=0.3)


async def episode(client: RoutingClient, turns: int) -> list[int]:
    """Play ``turns`` turns of one episode, each prompt extending the last; the replica of each turn."""
    ep, prompt, where = client.episode(), [1, 2, 3], []
    for _ in range(turns):
        await ep.complete(prompt, PARAMS)
        where.append(ep.last[0])
        prompt = prompt + [7, 8, 9, 4]
    return where


# ---------------------------------------------------------------- placement


def test_cache_aware_keeps_an_episodes_turns_on_one_replica_and_round_robin_does_not():
    async def main(router) -> list[list[int]]:
        client = routed([Replica(), Replica()], router)
        try:
            return await asyncio.gather(*(episode(client, 4) for _ in range(5)))  # odd: no lockstep
        finally:
            await client.aclose()

    sticky = asyncio.run(main(CacheAware()))
    assert all(len(set(turns)) == 1 for turns in sticky)  # every later turn where its prefix is cached
    assert {turns[0] for turns in sticky} == {0, 1}  # new episodes spread over both replicas
    spread = asyncio.run(main(RoundRobin()))
    assert all(len(set(turns)) == 2 for turns in spread)  # round-robin moves every episode


def test_new_episodes_go_to_the_replica_with_the_lower_load():
    async def main() -> tuple[list[int], Replica, Replica]:
        busy, idle = Replica(load=60), Replica(load=2)
        client = routed([busy, idle], CacheAware())
        client.load.reading(0)  # starts the first refresh
        await asyncio.sleep(0.05)
        firsts = [(await episode(client, 1))[0] for _ in range(5)]
        await client.aclose()
        return firsts, busy, idle

    firsts, busy, idle = asyncio.run(main())
    assert firsts == [1] * 5  # pressure 60/128 against 2/128 (+ its own requests)
    assert busy.reads == 1 and idle.reads == 1  # one reading serves every request within the second


def test_load_readings_are_cached_not_one_http_call_per_request():
    async def main() -> list[Replica]:
        replicas = [Replica(delay_s=0.001), Replica(delay_s=0.001)]
        client = routed(replicas, CacheAware())
        await asyncio.gather(*(episode(client, 3) for _ in range(40)))  # 120 requests in well under a second
        await client.aclose()
        return replicas

    replicas = asyncio.run(main())
    assert sum(len(r.prompts) for r in replicas) == 120
    assert all(r.reads <= 2 for r in replicas)


def test_in_flight_requests_count_as_load_between_readings():
    async def main() -> list[int]:
        a, b = Replica(), Replica()
        a.hang = b.hang = asyncio.Event()
        client = routed([a, b], CacheAware())
        tasks = [asyncio.ensure_future(episode(client, 1)) for _ in range(6)]
        await asyncio.sleep(0.05)
        counts = list(client.in_flight)
        a.hang.set()
        await asyncio.gather(*tasks)
        await client.aclose()
        return counts

    assert asyncio.run(main()) == [3, 3]  # no reading says so yet: the client's own requests balance them


def test_a_failed_metrics_read_is_logged_once_and_routing_goes_on(caplog):
    async def main() -> list[Replica]:
        replicas = [Replica(), Replica()]
        replicas[0].fail = True
        client = RoutingClient([RoutedReplica(r, r) for r in replicas], CacheAware(), load_interval_s=0.01)
        for _ in range(5):
            await episode(client, 2)
            await asyncio.sleep(0.02)  # a refresh is due again
        await client.aclose()
        return replicas

    with caplog.at_level(logging.DEBUG, logger="sao.agents.engine.meter"):
        replicas = asyncio.run(main())
    assert sum(len(r.prompts) for r in replicas) == 10  # every request served
    assert replicas[0].reads >= 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "replica 0: /metrics could not be read" in warnings[0].getMessage()


# ---------------------------------------------------------------- a dead replica


def test_a_request_cut_by_a_dead_replica_is_sent_to_the_other():
    async def main() -> tuple[list[int], RoutingClient, list[Replica]]:
        a, b = Replica(), Replica()
        a.hang = asyncio.Event()  # a never answers: it dies with the request in flight
        async with EngineWatch(a, WatchConfig(interval_s=0.02, max_restarts=0)) as watch:
            client = routed([a, b], RoundRobin(), [watch, None])
            task = asyncio.ensure_future(episode(client, 2))
            await asyncio.sleep(0.1)
            assert len(a.prompts) == 1 and not task.done()
            a.running = False  # the engine's process exits
            where = await asyncio.wait_for(task, 5)
            await client.aclose()
        return where, client, [a, b]

    where, client, (a, b) = asyncio.run(main())
    assert where == [1, 1]  # the cut first turn went to b; a never serves again (no restarts)
    assert client.stats.failovers == 1 and len(b.prompts) == 2
    assert b.prompts[0] == a.prompts[0]  # the same request, sent again


def test_a_restarted_replica_serves_again_but_holds_no_cache():
    async def main() -> tuple[list[int], Replica]:
        a, b = Replica(load=0), Replica(load=50)
        async with EngineWatch(a, WatchConfig(interval_s=0.02, max_restarts=1)) as watch:
            client = routed([a, b], CacheAware(), [watch, None])
            client.load.reading(0)
            await asyncio.sleep(0.05)
            ep = client.episode()
            await ep.complete([1, 2], PARAMS)
            first = ep.last
            a.running = False
            await asyncio.sleep(0.2)  # seen dead, restarted (a new life)
            assert watch.generation == 1 and a.restarts == 1
            assert all(not v.holds for v in client.views(ep))  # its prefix died with the old life
            await ep.complete([1, 2, 7, 8, 9, 3], PARAMS)
            await client.aclose()
        return [first[0], ep.last[0]], a

    where, a = asyncio.run(main())
    assert where == [0, 0] and len(a.prompts) == 2  # back on a (less loaded), as a new placement


def test_every_replica_dead_for_good_ends_the_episode_with_restarts_exhausted():
    async def main() -> None:
        a = Replica()
        a.running = False
        async with EngineWatch(a, WatchConfig(interval_s=0.02, max_restarts=0)) as watch:
            await asyncio.sleep(0.1)
            client = routed([a], CacheAware(), [watch])
            with pytest.raises(EngineRestartsExhausted):
                await asyncio.wait_for(episode(client, 1), 5)
            await client.aclose()

    asyncio.run(main())


def test_an_error_on_a_live_replica_is_the_episodes_not_a_failover():
    class Failing(Replica):
        async def complete(self, prompt_ids, params):
            raise EngineError("HTTP 400: bad request")

    async def main() -> RoutingClient:
        a = Failing()
        async with EngineWatch(a, WatchConfig(interval_s=0.02)) as watch:
            client = routed([a, Replica()], RoundRobin(), [watch, None])
            with pytest.raises(EngineError, match="bad request"):
                await episode(client, 1)
            await client.aclose()
        return client

    assert asyncio.run(main()).stats.failovers == 0


# ---------------------------------------------------------------- per-window engine metrics


class Counters:
    """``/metrics`` counters that grow by ``step`` per read; ``fail`` raises; ``reset`` restarts them."""

    def __init__(self, hits: int, queries: int, drafted: int = 0, accepted: int = 0):
        self.step = (hits, queries, drafted, accepted)
        self.now = [0, 0, 0, 0]
        self.fail = False

    async def metrics(self) -> EngineMetrics:
        self.now = [a + b for a, b in zip(self.now, self.step)]  # the engine works whether it is read or not
        if self.fail:
            raise EngineError("GET /metrics: ReadTimeout")
        h, q, d, a = self.now
        return EngineMetrics(prefix_cache_hits=h, prefix_cache_queries=q, spec_draft_tokens=d,
                             spec_accepted_tokens=a, spec_drafts=d // 4)


def test_the_meter_sums_replicas_windows_and_survives_failures_and_restarts(caplog):
    async def main() -> list[EngineMetrics | None]:
        a, b = Counters(30, 100, 40, 10), Counters(10, 100)
        meter = EngineMeter([a, b])
        await meter.start()
        out = [await meter.window()]  # both: (30 + 10) / (100 + 100)
        b.fail = True
        out.append(await meter.window())  # a alone
        b.fail = False
        out.append(await meter.window())  # b's growth over two windows
        a.now = [0, 0, 0, 0]  # a restarted: its counters start again (one step by the next read)
        out.append(await meter.window())
        a.fail = b.fail = True
        out.append(await meter.window())
        return out

    with caplog.at_level(logging.WARNING, logger="sao.agents.engine.meter"):
        w = asyncio.run(main())
    assert w[0].prefix_cache_hit_rate == pytest.approx(0.2) and w[0].spec_acceptance == pytest.approx(0.25)
    assert (w[1].prefix_cache_hits, w[1].prefix_cache_queries) == (30, 100)
    assert (w[2].prefix_cache_hits, w[2].prefix_cache_queries) == (30 + 20, 100 + 200)
    assert (w[3].prefix_cache_hits, w[3].prefix_cache_queries) == (30 + 10, 100 + 100)  # a: its first read since
    assert w[4] is None
    # one warning per run of failures: b's, then (b answered in between) a's and b's again
    assert [r.getMessage()[:9] for r in caplog.records] == ["replica 1", "replica 0", "replica 1"]


def test_step_metrics_keys_with_and_without_speculation():
    used = combined([EngineMetrics(prefix_cache_hits=30, prefix_cache_queries=100, spec_drafts=10,
                                   spec_draft_tokens=40, spec_accepted_tokens=10)])
    on = engine_step_metrics(used, speculative=True, replicas=2)
    assert on["rollout/prefix_cache_hit_rate"] == pytest.approx(0.3)
    assert on["engine/spec_acceptance"] == pytest.approx(0.25)  # 10 of 40 draft tokens
    assert on["engine/spec_accepted_per_draft"] == pytest.approx(1.0)  # 10 accepted over 10 drafts
    assert on["engine/metrics_replicas"] == 2.0
    off = engine_step_metrics(used, speculative=False, replicas=1)
    assert "rollout/prefix_cache_hit_rate" in off and not any(k.startswith("engine/spec") for k in off)
    idle = engine_step_metrics(EngineMetrics(), speculative=True, replicas=1)
    assert idle["rollout/prefix_cache_hit_rate"] == 0.0 and idle["engine/spec_acceptance"] == 0.0  # no NaN
    assert engine_step_metrics(None, speculative=True, replicas=0) == {}

    async def steps() -> list[dict[str, float]]:
        source = Counters(5, 10, 8, 2)
        stepper = StepEngineMetrics(EngineMeter([source]), speculative=True)
        await stepper.start()
        first = await stepper.step()
        source.fail = True
        return [first, await stepper.step()]

    first, failed = asyncio.run(steps())
    assert first["rollout/prefix_cache_hit_rate"] == 0.5 and first["engine/spec_acceptance"] == 0.25
    assert failed == {}  # the step goes on without them


# ---------------------------------------------------------------- sao-eval --replicas on scripted servers

_QUESTION = re.compile(r"What is (-?\d+) ([-+*/]) (-?\d+)\?")


def _prefix_counts(prompts: list[list[int]]) -> str:
    """Prometheus text of a prefix cache that holds every earlier prompt of this server, by token."""
    hits = 0
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            n = 0
            while n < min(len(p), len(q)) and p[n] == q[n]:
                n += 1
            best = max(best, n)
        hits += best
    queries = sum(len(p) for p in prompts)
    return f"vllm:prefix_cache_queries_total {queries}\nvllm:prefix_cache_hits_total {hits}\n"


@pytest.fixture(scope="module")
def model_tokenizer():
    model = Path(os.path.expanduser("~/.cache/sao/models/smollm2-135m"))
    if not (model / "tokenizer.json").exists():
        pytest.skip("the bundled model's tokenizer is not installed (bash scripts/setup)")
    from transformers import AutoTokenizer

    return str(model), AutoTokenizer.from_pretrained(model)


def test_sao_eval_with_two_replicas_keeps_turns_sticky_sums_hits_and_survives_a_dead_replica(tmp_path, model_tokenizer):
    from sao.agents.clients.endpoint import Endpoint
    from sao.agents.store import TrajectoryWriter, read_trajectories
    from sao.agents.testing.fake_server import FakeServer, Reply
    from sao.evals.engines import measured
    from sao.evals.runner import EvalConfig, plan, run_pairs, summarize
    from tests.test_engine_watch import FakeEngine

    path, tokenizer = model_tokenizer
    servers = [FakeServer(tokenizer=tokenizer), FakeServer(tokenizer=tokenizer)]
    engines = [FakeEngine(s) for s in servers]
    answered = {"n": 0}
    lock = threading.Lock()

    def respond(request: dict, prompt: str) -> Reply:
        a, op, b = _QUESTION.search(prompt).groups()  # type: ignore[union-attr]
        value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) // int(b or 1)}[op]
        first_turn = prompt.count("<|im_start|>user") == 1
        with lock:
            answered["n"] += 1
            if answered["n"] == 12:  # replica 0 dies a third of the way in; no restarts left
                threading.Thread(target=servers[0].kill).start()
        return Reply(text=f"\\boxed{{{value + 1 if first_turn else value}}}", delay_s=0.05)  # wrong, then right

    for s in servers:
        s.responder = respond
        s.metrics = lambda s=s: _prefix_counts([r["prompt"] for r in s.requests])
    cfg = EvalConfig(benchmark="arithmetic", output=tmp_path, limit=8, samples=2, concurrency=4, max_tokens=64,
                     max_turns=3, timeout_s=10.0, max_restarts=0, replicas=2, router="cache_aware",
                     env_args={"feedback_turns": 1})
    ids, env_kwargs = plan(cfg)
    pairs = [(t, s) for t in ids for s in range(cfg.samples)]
    with servers[0], servers[1]:
        endpoints = [Endpoint(s.base_url, "fake", path, 4096, managed=True, server=e) for s, e in zip(servers, engines)]
        with TrajectoryWriter(tmp_path / "trajectories.jsonl") as writer:
            engine = asyncio.run(measured(cfg, endpoints, lambda: run_pairs(cfg, endpoints, env_kwargs, pairs, writer)))
    trajectories = read_trajectories(tmp_path / "trajectories.jsonl")
    assert len(trajectories) == 16 and len({(t.task_id, t.sample) for t in trajectories}) == 16
    assert all(t.status == "ok" and t.correct and len(t.turns) == 2 for t in trajectories)
    assert engines[0].stops == 1  # given up on (max_restarts=0): the rest ran on replica 1
    routing = engine["routing"]
    assert routing["router"] == "cache_aware" and routing["later_turns"] == 16
    # a second turn runs where its first ran (its prefix is cached there), unless that replica died
    away = 0
    for s in servers:
        prompts = [r["prompt"] for r in s.requests]
        for p in prompts:
            if tokenizer.decode(p).count("<|im_start|>user") == 2:
                away += not any(q != p and p[:len(q)] == q for q in prompts)
    assert away == routing["moved_turns"] <= cfg.concurrency  # only episodes in flight at the death moved
    assert routing["failovers"] >= 1 and sum(routing["requests_per_replica"]) == 32
    assert engine["replicas"] == 2 and engine["router"] == "cache_aware"
    # replica 0's /metrics is gone at the end: the sum is replica 1's alone, and still a number
    assert engine["prefix_cache_hit_rate"] is not None and 0 < engine["prefix_cache_hit_rate"] < 1
    summary, _ = summarize(cfg, ids, wall_s=1.0)
    assert summary["pass@1"] == 1.0 and summary["n_failed"] == 0


# ---------------------------------------------------------------- sao-train: the step's engine metrics


@pytest.mark.parametrize("readable", [True, False])
def test_every_training_step_logs_the_engines_prefix_hits_and_acceptance(tmp_path, readable):
    from sao.agents.engine.control import EngineClient
    from sao.agents.testing.fake_server import FakeServer
    from tests.test_train import FakeEngine, config, lines, make_trainer, responder

    reads = {"n": 0}

    def metrics() -> str:  # each read: 10 more prompt tokens looked up, 4 found; 8 drafted, 2 accepted
        reads["n"] += 1
        n = reads["n"]
        return (f"vllm:prefix_cache_queries_total {10 * n}\nvllm:prefix_cache_hits_total {4 * n}\n"
                f"vllm:spec_decode_num_draft_tokens_total {8 * n}\nvllm:spec_decode_num_accepted_tokens_total {2 * n}\n"
                f"vllm:spec_decode_num_drafts_total {2 * n}\n")

    with FakeServer(responder=responder, metrics=metrics if readable else None) as server:
        trainer = make_trainer(config("grpo", max_steps=2), tmp_path, server, FakeEngine())

        async def main() -> None:
            async with EngineClient(server.base_url.removesuffix("/v1")) as control:
                trainer.engine_metrics = StepEngineMetrics(EngineMeter([control]), speculative=True)
                await trainer.run()

        asyncio.run(main())
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # a /metrics that cannot be read fails no step
    for r in rows:
        if readable:
            assert r["rollout/prefix_cache_hit_rate"] == pytest.approx(0.4)
            assert r["engine/spec_acceptance"] == pytest.approx(0.25)
            assert r["engine/spec_accepted_per_draft"] == pytest.approx(1.0)
        else:
            assert "rollout/prefix_cache_hit_rate" not in r and "engine/spec_acceptance" not in r


def test_eval_replicas_need_local_engines_and_a_known_router(tmp_path):
    from sao.evals.errors import EvalError
    from sao.evals.runner import EvalConfig

    with pytest.raises(EvalError, match="--replicas starts"):
        EvalConfig(benchmark="arithmetic", output=tmp_path, replicas=2, base_url="http://127.0.0.1:1/v1")
    with pytest.raises(EvalError, match="--router"):
        EvalConfig(benchmark="arithmetic", output=tmp_path, replicas=2, router="pinned")
    with pytest.raises(EvalError, match="--replicas must be"):
        EvalConfig(benchmark="arithmetic", output=tmp_path, replicas=0)
