"""DORA's rebalancing as the ``multi_version`` scheduler plans it (``rebalance``; METHOD.md 2: "a running
request can move between engines of the same version"), and the clock of the time replicas drain.

A draining replica of an old version ``v`` that holds at most ``drain_below * max_concurrency``
trajectories moves them all to other live replicas of ``v`` with free slots, most loaded first, and
syncs at once. Only onto a replica that is more loaded (ties: higher id), so a trajectory never moves
back and every move empties a replica; only when every one of the source's trajectories fits, since a
half-emptied replica still cannot upgrade.
"""

from __future__ import annotations

from sao.rl.rollout.schedulers.core import ReplicaStatus, SchedulerConfig
from sao.rl.rollout.schedulers.replicas import ReplicaPool


def rebalance_plan(pool: ReplicaPool, cfg: SchedulerConfig, version: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """The moves that empty ``version``'s lightly loaded draining replicas (module doc), as
    ``[(source replica, [(trajectory, target replica), ...]), ...]``; the loads are counted as the plan
    fills the targets, and ``pool`` is not changed."""
    live = sorted((r for r in pool if r.version == version and r.load
                   and r.status in (ReplicaStatus.SERVING, ReplicaStatus.DRAINING)), key=lambda r: (r.load, r.rid))
    load = {r.rid: r.load for r in live}
    few = cfg.drain_below * cfg.max_concurrency
    plan: list[tuple[int, list[tuple[int, int]]]] = []
    for src in live:
        if src.status is not ReplicaStatus.DRAINING or not 0 < load[src.rid] <= few:
            continue
        key = (load[src.rid], src.rid)
        targets = [r.rid for r in live if (load[r.rid], r.rid) > key and load[r.rid] < pool.capacity]
        if sum(pool.capacity - load[t] for t in targets) < load[src.rid]:
            continue
        moves = []
        for tid in sorted(src.in_flight):
            dst = max((t for t in targets if load[t] < pool.capacity), key=lambda t: (load[t], t))
            moves.append((tid, dst))
            load[dst] += 1
        load[src.rid] = 0
        plan.append((src.rid, moves))
    return plan


class DrainClock:
    """Replica-seconds spent draining: holding an old version with work in flight and admitting nothing new."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}  # replica -> when it stopped admitting
        self._closed = 0.0

    def start(self, rid: int, now: float) -> None:
        self._since.setdefault(rid, now)

    def stop(self, rid: int, now: float) -> None:
        since = self._since.pop(rid, None)
        if since is not None:
            self._closed += now - since

    def total(self, now: float) -> float:
        """Up to ``now``, open intervals included."""
        return self._closed + sum(now - t for t in self._since.values())
