"""A completion client over several engine replicas that places every request with a :class:`Router`.

Each episode takes its own client, :meth:`RoutingClient.episode`, so that its requests are known as
turns of one trajectory: turn 0 is a new trajectory, later turns carry the trajectory's id and the
length of the context already sent. For each request the client builds a
:class:`~sao.agents.routing.routers.ReplicaView` per replica and asks the router
(:mod:`sao.agents.routing.routers`; ``cache_aware`` keeps a later turn where its previous turn ran, whose
prefix cache holds its context, unless that replica is overloaded; new trajectories go to the least
loaded replica; ``round_robin`` ignores caches):

* load: running and waiting requests and KV-cache usage from the replica's ``/metrics``, read at most
  about once a second (:class:`~sao.agents.routing.replica_load.LoadBoard`, never one HTTP call per request),
  and between readings the requests this client has in flight there (``running + waiting`` is
  the larger of the two);
* locality: where the trajectory's previous turn ran, in the replica's current life (a restarted
  engine holds no cache);
* constraints: the episode's ``version`` / ``min_version`` (C1 and the staleness floor; a training
  driver sets them) against each replica's ``version``, and whether it serves now.

A replica with a :class:`~sao.agents.engine.watch.EngineWatch` (a managed engine) that dies under a
request cuts it; the request is sent again, to a replica that serves (the others, or this one once
restarted): sampling holds no state in the engine, so the episode goes on where it was. A request
that fails on a replica that did not die fails as usual (the episode records it). With every
replica's restarts used up, :class:`~sao.agents.engine.watch.EngineRestartsExhausted`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ..clients import CompletionClient, SamplingParams
from ..engine import EngineMetrics
from ..engine.meter import MetricsSource
from ..engine.watch import EngineRestartsExhausted, EngineWatch, died_since, until_death
from ..records import Completion
from .replica_load import LoadBoard
from .routers import ReplicaView, RouteRequest, Router

log = logging.getLogger(__name__)


@dataclass
class RoutedReplica:
    """One replica: where completions go, where its load is read, and (managed) the watch of its process.
    ``capacity``: requests it runs at once (vLLM's ``max_num_seqs``: 128 on the CPU), to compare loads."""

    client: CompletionClient
    metrics: MetricsSource
    watch: EngineWatch | None = None
    version: int = 0
    capacity: int = 128

    @property
    def life(self) -> int:
        """Bumped at each death (the watch's generation): a new life holds no cache."""
        return self.watch.generation if self.watch is not None else 0

    @property
    def serving(self) -> bool:
        return self.watch is None or self.watch.serving


@dataclass
class RoutingStats:
    """What the client did: requests per replica, later turns moved off their previous replica, and
    requests sent again because their replica died under them."""

    requests: list[int]
    later_turns: int = 0
    moved: int = 0
    failovers: int = 0

    def summary(self) -> dict[str, object]:
        return {"requests_per_replica": list(self.requests), "later_turns": self.later_turns,
                "moved_turns": self.moved, "failovers": self.failovers}


class EpisodeClient:
    """One episode's :class:`~sao.agents.clients.completions.CompletionClient` over a :class:`RoutingClient`."""

    def __init__(self, owner: RoutingClient, traj_id: int, *, version: int | None = None,
                 min_version: int | None = None, home: int | None = None):
        self.owner, self.traj_id = owner, traj_id
        self.version, self.min_version, self.home = version, min_version, home
        self.turn = 0
        self.context = 0  # tokens sent and received so far: the prefix a later turn can find cached
        self.last: tuple[int, int] | None = None  # (replica, its life) of the previous turn

    def request(self) -> RouteRequest:
        return RouteRequest(self.traj_id, self.turn, self.context, self.version, self.min_version, self.home)

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        completion = await self.owner.send(self, prompt_ids, params)
        self.turn += 1
        self.context = len(prompt_ids) + len(completion.token_ids)
        return completion


class RoutingClient:
    """Places each request of each episode on a replica (module doc)."""

    def __init__(self, replicas: Sequence[RoutedReplica], router: Router, *, load_interval_s: float = 1.0,
                 wait_s: float = 0.1, grace_s: float = 2.0):
        if not replicas:
            raise ValueError("a routing client needs at least one replica")
        self.replicas, self.router = list(replicas), router
        self.load = LoadBoard([r.metrics for r in self.replicas], interval_s=load_interval_s)
        self.wait_s, self.grace_s = wait_s, grace_s
        self.in_flight = [0] * len(self.replicas)
        self.stats = RoutingStats([0] * len(self.replicas))
        self._ids = 0

    def episode(self, *, version: int | None = None, min_version: int | None = None,
                home: int | None = None) -> EpisodeClient:
        """A client for one new episode (its own trajectory id)."""
        self._ids += 1
        return EpisodeClient(self, self._ids, version=version, min_version=min_version, home=home)

    def views(self, episode: EpisodeClient) -> list[ReplicaView]:
        """Every replica as the router sees it for ``episode``'s next request (module doc)."""
        out = []
        for rid, r in enumerate(self.replicas):
            read = self.load.reading(rid) or EngineMetrics()
            holds = frozenset({episode.traj_id}) if episode.last == (rid, r.life) else frozenset()
            running = max(read.running, self.in_flight[rid] - read.waiting)
            out.append(ReplicaView(rid, r.version, running, read.waiting, read.kv_cache_usage, r.capacity, holds,
                                   r.serving))
        return out

    async def send(self, episode: EpisodeClient, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """``episode``'s next request, on the replica the router chooses; sent again if that one dies."""
        while True:
            rid = await self._place(episode)
            life = self.replicas[rid].life
            completion = await self._on(rid, prompt_ids, params)
            if completion is not None:
                self._count(episode, rid)
                episode.last = (rid, life)
                return completion
            self.stats.failovers += 1
            log.info("a request cut by replica %d's death is sent again", rid)

    async def _place(self, episode: EpisodeClient) -> int:
        """The router's choice; waits while no replica may serve (one is being restarted)."""
        while True:
            rid = self.router.choose(episode.request(), self.views(episode))
            if rid is not None:
                return rid
            if all(r.watch is not None and r.watch.exhausted for r in self.replicas):
                raise EngineRestartsExhausted("every replica died and its restarts are used up")
            await asyncio.sleep(self.wait_s)

    async def _on(self, rid: int, prompt_ids: Sequence[int], params: SamplingParams) -> Completion | None:
        """The completion from replica ``rid``; None when the replica died under the request."""
        replica = self.replicas[rid]
        self.in_flight[rid] += 1
        try:
            if replica.watch is None:
                return await replica.client.complete(prompt_ids, params)
            watch, generation = replica.watch, replica.watch.generation
            request = await until_death(watch, replica.client.complete(prompt_ids, params))
            if request.cancelled():
                return None
            error = request.exception()
            if error is None:
                return request.result()
            if await died_since(watch, generation, self.grace_s):
                return None
            raise error
        finally:
            self.in_flight[rid] -= 1

    def _count(self, episode: EpisodeClient, rid: int) -> None:
        self.stats.requests[rid] += 1
        if episode.turn > 0:
            self.stats.later_turns += 1
            self.stats.moved += episode.last is not None and episode.last[0] != rid

    async def aclose(self) -> None:
        """Stop the load refresh (the replicas' clients belong to whoever made them)."""
        await self.load.aclose()
