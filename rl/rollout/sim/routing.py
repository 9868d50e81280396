"""The simulator's turn placement: per-replica prefix caches, a router, and the prefill a miss costs.

:class:`TurnPlacer` is the simulator's half of routing (:mod:`sao.agents.routing.routers` is the pure
policy). Each later turn of a trajectory is a request: the placer builds a
:class:`~sao.agents.routing.routers.ReplicaView` of every replica that could take it, asks the router,
and charges the recomputed prefill of whatever part of the trajectory's prefix the chosen replica
does not hold. Turn 0 runs where the scheduler started the trajectory (its admission decision).

A replica may take a turn when it is alive, not loading weights (nor waiting to), and either runs
fewer than ``capacity`` requests or is the trajectory's home (the replica whose slot the scheduler
reserved for it; a home is always eligible, as before routing). Version constraints: C1 modes
require the trajectory's one version; ``async`` requires at least the version of its last turn.

Hit rate, as vLLM counts it: prompt tokens found in the cache / prompt tokens presented (each
turn presents its whole context: the prefix plus the new input).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from sao.agents.routing import Pinned, ReplicaView, RouteRequest, make_router
from sao.rl.rollout.sim.config import RoutingConfig


class PrefixCache:
    """One replica's prefix cache: trajectory id -> cached prefix tokens, least recently used first out."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.tokens = 0
        self._lru: OrderedDict[int, int] = OrderedDict()

    def __contains__(self, tid: int) -> bool:
        return tid in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def get(self, tid: int) -> int:
        """Cached tokens of ``tid``'s prefix (0 when none); a hit makes it most recently used."""
        n = self._lru.get(tid, 0)
        if n:
            self._lru.move_to_end(tid)
        return n

    def put(self, tid: int, tokens: int) -> list[int]:
        """Cache ``tokens`` of ``tid``'s prefix; returns the ids evicted to make room (possibly ``tid``)."""
        self.tokens -= self._lru.pop(tid, 0)
        self._lru[tid] = tokens
        self.tokens += tokens
        evicted = []
        while self.capacity is not None and self.tokens > self.capacity and self._lru:
            old, n = self._lru.popitem(last=False)
            self.tokens -= n
            evicted.append(old)
        return evicted

    def drop(self, tid: int) -> None:
        self.tokens -= self._lru.pop(tid, 0)

    def clear(self) -> list[int]:
        ids = list(self._lru)
        self._lru.clear()
        self.tokens = 0
        return ids


@dataclass(frozen=True)
class Slot:
    """What the placer needs to know of one engine: its version and whether it may take a turn."""

    version: int
    running: int
    available: bool  # alive, not paused, no weight load pending


@dataclass
class CacheCounters:
    """Prompt tokens presented and found cached, and later turns that found any of their prefix."""

    presented: int = 0
    reused: int = 0
    later_turns: int = 0
    later_hits: int = 0
    moved: int = 0  # later turns run elsewhere than the turn before

    @property
    def hit_rate(self) -> float:
        return self.reused / self.presented if self.presented else 0.0

    @property
    def turn_hit_rate(self) -> float:
        return self.later_hits / self.later_turns if self.later_turns else 0.0


class TurnPlacer:
    """Routes later turns and keeps every replica's prefix cache (module docstring)."""

    def __init__(self, config: RoutingConfig, n: int, capacity: int, one_version: bool) -> None:
        self.config, self.capacity, self.one_version = config, capacity, one_version
        self.router = make_router(config.router, config.margin, config.margin_per_ktoken)
        self.caches = [PrefixCache(config.cache_tokens) for _ in range(n)]
        self._where: dict[int, set[int]] = {}  # trajectory id -> replicas caching part of its prefix
        self._views: list[ReplicaView | None] = [None] * n  # None: changed since last built
        self.counters = CacheCounters()

    def mark(self, rid: int) -> None:
        """Engine ``rid`` changed (batch, pause, version, liveness): rebuild its view when next needed."""
        self._views[rid] = None

    def place(self, tid: int, turn: int, prefix: int, home: int, last: int, versions: tuple[int, ...],
              slot: Callable[[int], Slot]) -> int:
        """The replica for turn ``turn`` of ``tid`` (``prefix`` tokens of context before it; ``last``:
        where its previous turn ran; ``versions``: the versions it has used). ``slot`` reads an
        engine; it is called only for engines :meth:`mark`-ed since their last view."""
        if turn == 0 or isinstance(self.router, Pinned):
            return home
        for rid, v in enumerate(self._views):
            if v is None:
                s = slot(rid)
                self._views[rid] = ReplicaView(rid, s.version, s.running, capacity=self.capacity,
                                               accepting=s.available and s.running < self.capacity)
        views: list[ReplicaView] = list(self._views)  # type: ignore[arg-type]  # all built above
        views[home] = replace(views[home], accepting=True)  # its slot is reserved: always eligible
        for rid in self._where.get(tid, ()):
            views[rid] = replace(views[rid], holds=frozenset((tid,)))
        version = versions[0] if self.one_version else None
        floor = None if self.one_version else versions[-1]
        rid = self.router.choose(RouteRequest(tid, turn, prefix, version, floor, home), views)
        if rid is None:
            rid = home  # never happens while the home is alive: it is always eligible
        self.counters.moved += rid != last
        return rid

    def prefill(self, rid: int, tid: int, turn: int, prefix: int, new_tokens: int) -> int:
        """Count the lookup of ``tid``'s prefix on ``rid``; returns the prefix tokens to recompute."""
        cached = self._lookup(rid, tid, prefix, presented=prefix + new_tokens)
        if turn > 0:
            self.counters.later_turns += 1
            self.counters.later_hits += cached > 0
        return prefix - cached

    def recompute(self, rid: int, tid: int, prefix: int) -> int:
        """A running request of ``tid`` moved to ``rid`` mid-turn with ``prefix`` tokens (context, the turn's
        input and what it generated so far): count the lookup; returns the tokens to prefill again."""
        return prefix - self._lookup(rid, tid, prefix, presented=prefix)

    def _lookup(self, rid: int, tid: int, prefix: int, presented: int) -> int:
        """The tokens of ``tid``'s ``prefix`` that ``rid`` caches, counted with ``presented`` tokens looked up."""
        cached = min(self.caches[rid].get(tid), prefix)
        self.counters.presented += presented
        self.counters.reused += cached
        return cached

    def cached(self, rid: int, tid: int, tokens: int) -> None:
        """``rid`` finished a turn of ``tid``: it now holds ``tokens`` of its context."""
        self._where.setdefault(tid, set()).add(rid)
        for old in self.caches[rid].put(tid, tokens):
            self._unplace(old, rid)

    def forget(self, tid: int) -> None:
        """``tid`` ended: its prefix is of no further use anywhere."""
        for rid in self._where.pop(tid, ()):
            self.caches[rid].drop(tid)

    def flush(self, rid: int) -> None:
        """``rid`` loaded new weights (or died): its cached KV is gone."""
        for tid in self.caches[rid].clear():
            self._unplace(tid, rid)

    def _unplace(self, tid: int, rid: int) -> None:
        where = self._where.get(tid)
        if where is not None:
            where.discard(rid)
            if not where:
                del self._where[tid]
