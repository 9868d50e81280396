"""WAR, part 2 (run by ``benchmarks/war.py``): cache-aware against round-robin routing over 2 replicas.

The recorded requests of ``war.py`` are grouped back into their episodes (a request's seed is
1000 x episode + turn). Each arm replays the same episodes at high load (``concurrency`` episodes in
flight over the two replicas), every turn after the previous one of its episode has come back, through
the project's :class:`~sao.agents.routing.client.RoutingClient` with the arm's router. Between arms both
prefix caches are emptied (``POST /reset_prefix_cache``), so neither arm finds what the other left.

A later turn's prompt is the recorded one: the previous turn's prompt, the *recorded* answer and the
tool's output. Its cacheable prefix on the replica that served the previous turn is therefore that
turn's prompt (the freshly sampled answer differs from the recorded one); the shared system prompt
is cached on both replicas in either arm.

Figures per arm: completion tokens per second of wall time, the prefix-cache hit rate (prompt tokens
found / looked up, ``/metrics`` of both replicas summed over the arm), later turns moved off their
replica. Target (issue 11): cache-aware >= 1.2x round-robin in tokens/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sao.agents.clients.completions import OpenAICompletionClient, SamplingParams
from sao.agents.engine.control import EngineClient
from sao.agents.engine.meter import EngineMeter
from sao.agents.engine.metrics import EngineMetrics
from sao.agents.engine.server import VLLMServer
from sao.agents.routing.client import RoutedReplica, RoutingClient
from sao.agents.routing.routers import make_router

ROUTERS = ("round_robin", "cache_aware")
TARGET = 1.2


@dataclass(frozen=True)
class Arm:
    """One router's replay: tokens over wall seconds, both replicas' counters, what the router did."""

    router: str
    episodes: int
    requests: int
    tokens: int
    wall_s: float
    metrics: EngineMetrics | None
    routing: dict[str, Any]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def hit_rate(self) -> float:
        return (self.metrics.prefix_cache_hit_rate or 0.0) if self.metrics else 0.0


def episodes_of(requests: list[Any]) -> list[list[Any]]:
    """The recorded requests as episodes (lists of turns in order), episodes in recording order."""
    by_episode: dict[int, list[Any]] = defaultdict(list)
    for r in requests:
        by_episode[r.seed // 1000].append(r)
    return [sorted(turns, key=lambda r: r.seed % 1000) for _, turns in sorted(by_episode.items())]


async def replay(servers: list[VLLMServer], model: str, router: str, episodes: list[list[Any]], concurrency: int,
                 temperature: float) -> Arm:
    """The episodes through a routing client over ``servers`` (module doc), after emptying their caches."""
    async with contextlib.AsyncExitStack() as stack:
        controls = [await stack.enter_async_context(EngineClient(s.root_url)) for s in servers]
        for control in controls:
            if not await control.reset_prefix_cache():
                raise RuntimeError("a replica refused to empty its prefix cache (blocks in use)")
        clients = [OpenAICompletionClient(s.base_url, model, max_connections=concurrency) for s in servers]
        for client in clients:
            stack.push_async_callback(client.aclose)
        routing = RoutingClient([RoutedReplica(c, m) for c, m in zip(clients, controls)], make_router(router))
        stack.push_async_callback(routing.aclose)
        meter = EngineMeter(controls)
        await meter.start()
        gate = asyncio.Semaphore(concurrency)

        async def one(turns: list[Any]) -> int:
            async with gate:
                client, tokens = routing.episode(), 0
                for turn in turns:
                    params = SamplingParams(max_tokens=turn.max_tokens, temperature=temperature)
                    tokens += len((await client.complete(turn.prompt, params)).token_ids)
                return tokens

        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(e) for e in episodes)))
        wall = time.perf_counter() - t0
        used = await meter.window()
        return Arm(router, len(episodes), sum(map(len, episodes)), tokens, wall, used, routing.stats.summary())


def run_routing(servers: list[VLLMServer], model: str, episodes: list[list[Any]], warm: list[list[Any]],
                concurrency: int, temperature: float, console: Any) -> list[Arm]:
    """Warm both replicas up, then one arm per router over the same episodes."""
    asyncio.run(replay(servers, model, "round_robin", warm, concurrency, temperature))  # compile paths
    arms = []
    for router in ROUTERS:
        arm = asyncio.run(replay(servers, model, router, episodes, concurrency, temperature))
        console.print(f"{router:>12}: {arm.tokens_per_s:7.1f} tok/s ({arm.tokens} tokens, {arm.wall_s:.1f} s), "
                      f"prefix-cache hit rate {arm.hit_rate:.3f}, later turns moved {arm.routing['moved_turns']}"
                      f"/{arm.routing['later_turns']}, requests per replica {arm.routing['requests_per_replica']}")
        arms.append(arm)
    return arms


def routing_rows(arms: list[Arm]) -> tuple[list[dict[str, Any]], float]:
    """Rows for the table and ``war.json``, and the cache-aware / round-robin ratio of tokens/s."""
    by = {a.router: a for a in arms}
    ratio = by["cache_aware"].tokens_per_s / by["round_robin"].tokens_per_s
    rows = [{"router": a.router, "episodes": a.episodes, "requests": a.requests, "tokens": a.tokens,
             "wall_s": round(a.wall_s, 2), "tokens_per_s": a.tokens_per_s, "prefix_cache_hit_rate": a.hit_rate,
             "ratio": a.tokens_per_s / by["round_robin"].tokens_per_s, **a.routing,
             "engine": a.metrics.summary() if a.metrics else None} for a in arms]
    return rows, ratio
