"""The scheduler's view of the engine replicas: version, status and in-flight set of each.

This is bookkeeping only (what the scheduler has asked for and been told); the driver owns the
real engines and the truth of what each serves (:mod:`sao.rl.rollout.served`), which this record
follows through the events the driver sends (``SyncDone``, ``ReplicaDied``, ``ReplicaRestarted``).
``target`` is the version a replica is syncing to.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sao.rl.rollout.schedulers.core import LedgerError, ReplicaStatus

UNKNOWN_VERSION = -1


@dataclass
class ReplicaRecord:
    """One engine replica as the scheduler sees it: ``version`` is the one it was last told the replica
    serves (``SyncDone``; ``UNKNOWN_VERSION`` once it died)."""

    rid: int
    version: int = 0
    status: ReplicaStatus = ReplicaStatus.SERVING
    in_flight: set[int] = field(default_factory=set)
    target: int | None = None

    @property
    def load(self) -> int:
        return len(self.in_flight)


class ReplicaPool:
    """``n`` replicas, all serving ``version`` at the start, each running at most ``capacity``."""

    def __init__(self, n: int, capacity: int, version: int = 0) -> None:
        if n < 1:
            raise ValueError(f"need at least one replica, got {n}")
        self.capacity = capacity
        self.replicas = [ReplicaRecord(i, version) for i in range(n)]

    def __getitem__(self, rid: int) -> ReplicaRecord:
        return self.replicas[rid]

    def __iter__(self) -> Iterator[ReplicaRecord]:
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

    @property
    def in_flight(self) -> int:
        return sum(r.load for r in self.replicas)

    def alive(self) -> list[ReplicaRecord]:
        return [r for r in self.replicas if r.status is not ReplicaStatus.DEAD]

    def assign(self, n: int, eligible: Callable[[ReplicaRecord], bool] = lambda r: True,
               order: Callable[[ReplicaRecord], tuple] = lambda r: ()) -> list[int]:
        """Up to ``n`` replica ids for new trajectories: SERVING, ``eligible``, with a free slot,
        preferring the smallest ``order(replica)`` and then the least loaded (repeats allowed)."""
        heap = [(order(r), r.load, r.rid) for r in self.replicas
                if r.status is ReplicaStatus.SERVING and r.load < self.capacity and eligible(r)]
        heapq.heapify(heap)
        out: list[int] = []
        while heap and len(out) < n:
            key, load, rid = heapq.heappop(heap)
            out.append(rid)
            if load + 1 < self.capacity:
                heapq.heappush(heap, (key, load + 1, rid))
        return out

    def free_slots(self, eligible: Callable[[ReplicaRecord], bool] = lambda r: True) -> int:
        return sum(self.capacity - r.load for r in self.replicas
                   if r.status is ReplicaStatus.SERVING and eligible(r))

    def add(self, rid: int, traj_id: int) -> None:
        r = self.replicas[rid]
        if r.status is not ReplicaStatus.SERVING:
            raise LedgerError(f"replica {rid} is {r.status.value}; it cannot start trajectory {traj_id}")
        if r.load >= self.capacity:
            raise LedgerError(f"replica {rid} is full ({self.capacity})")
        r.in_flight.add(traj_id)

    def move(self, traj_id: int, src: int, dst: int) -> None:
        """``traj_id`` leaves ``src`` for ``dst``: both alive and not loading weights, one version, a free slot
        on ``dst`` (which may be draining: it takes no new trajectory, but may take a running one)."""
        a, b = self.replicas[src], self.replicas[dst]
        movable = (ReplicaStatus.SERVING, ReplicaStatus.DRAINING)
        if traj_id not in a.in_flight:
            raise LedgerError(f"replica {src} does not hold trajectory {traj_id}; it cannot move it")
        if src == dst or a.status not in movable or b.status not in movable:
            raise LedgerError(f"cannot move trajectory {traj_id} from replica {src} ({a.status.value}) "
                              f"to replica {dst} ({b.status.value})")
        if a.version != b.version:
            raise LedgerError(f"C1: cannot move trajectory {traj_id} from version {a.version} (replica {src}) "
                              f"to version {b.version} (replica {dst})")
        if b.load >= self.capacity:
            raise LedgerError(f"replica {dst} is full ({self.capacity})")
        a.in_flight.discard(traj_id)
        b.in_flight.add(traj_id)

    def remove(self, rid: int, traj_id: int) -> None:
        self.replicas[rid].in_flight.discard(traj_id)

    def begin_sync(self, rid: int, version: int) -> None:
        r = self.replicas[rid]
        r.status, r.target = ReplicaStatus.SYNCING, version

    def end_sync(self, rid: int, version: int) -> bool:
        """Record a :class:`SyncDone`; False when it is stale (the replica died meanwhile)."""
        r = self.replicas[rid]
        if r.status is not ReplicaStatus.SYNCING or r.target != version:
            return False
        r.status, r.version, r.target = ReplicaStatus.SERVING, version, None
        return True

    def die(self, rid: int) -> set[int]:
        """Mark dead; returns (and forgets) its in-flight trajectory ids."""
        r = self.replicas[rid]
        lost, r.in_flight = r.in_flight, set()
        r.status, r.version, r.target = ReplicaStatus.DEAD, UNKNOWN_VERSION, None
        return lost
