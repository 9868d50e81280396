"""What every mode shares: the ledger, the replica pool, the retry queue and the learner's version.

:class:`Book` turns the mechanical parts of an event into ledger and pool updates and returns the
actions they imply; the mode classes decide *what* to start, train and sync. Failure handling is
common too: an attempt lost to a dead replica or a broken episode is re-queued until its request
has failed ``max_failures`` times, then recorded failed. Attempts dropped for staleness are
re-queued without counting as failures.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable

from sao.rl.rollout.schedulers.core import (
    Action,
    CountingPrompts,
    Discard,
    LedgerError,
    MoveTrajectory,
    Prompt,
    PromptSource,
    RecordFailed,
    ReplicaDied,
    ReplicaStatus,
    Requeue,
    SchedulerConfig,
    StartTrajectory,
    SyncReplica,
    TrainOn,
)
from sao.rl.rollout.schedulers.ledger import Attempt, Ledger
from sao.rl.rollout.schedulers.replicas import ReplicaPool

log = logging.getLogger(__name__)


class Book:
    """Shared state of one scheduler. ``published``: the learner's newest version (from
    ``TrainStepDone``); ``next_step``: the learner version the next ``TrainOn`` will train at.
    ``start_version``: the learner's version when the schedule starts (k when a run resumes from
    the checkpoint of step k; every replica must serve it before the first ``StartTrajectory``)."""

    def __init__(self, config: SchedulerConfig, n_replicas: int, source: PromptSource | None = None,
                 start_version: int = 0) -> None:
        if start_version < 0:
            raise LedgerError(f"start_version must be >= 0, got {start_version}")
        self.config = config
        self.pool = ReplicaPool(n_replicas, config.max_concurrency, start_version)
        self.ledger = Ledger()
        self.source: PromptSource = source if source is not None else CountingPrompts()
        self.retries: deque[Prompt] = deque()
        self.failures: Counter[tuple[int, int]] = Counter()
        self.published = start_version
        self.next_step = start_version
        self.training = False  # an optimizer step is queued or running on the trainer
        self._traj = 0

    # ------------------------------------------------------------ starting and training

    def start(self, prompt: Prompt, rid: int, now: float) -> StartTrajectory:
        tid, self._traj = self._traj, self._traj + 1
        version = self.pool[rid].version
        self.pool.add(rid, tid)
        self.ledger.admit(tid, prompt, rid, version, now)
        return StartTrajectory(tid, prompt, rid, version)

    def next_prompt(self) -> Prompt:
        """A retry first, else the next prompt of the source (group size 1 modes)."""
        if self.retries:
            return self.retries.popleft()
        return self.source.next_group(1)[0]

    def train(self, traj_ids: Iterable[int], final: bool = True) -> tuple[TrainOn, list[int]]:
        """A ``TrainOn`` at ``next_step``; returns it and the staleness of each trajectory."""
        ids = tuple(traj_ids)
        if not ids:
            raise LedgerError("refusing to train on an empty micro-batch")
        staleness = self.ledger.train(ids, self.next_step)
        action = TrainOn(self.next_step, ids, final)
        if final:
            self.next_step += 1
            self.training = True
        return action, staleness

    def step_done(self, version: int) -> None:
        if version != self.next_step:
            raise LedgerError(f"TrainStepDone({version}) but the trainer was given step {self.next_step - 1}")
        self.published, self.training = version, False

    # ------------------------------------------------------------ replicas

    def sync(self, rid: int, version: int | None = None) -> SyncReplica:
        v = self.published if version is None else version
        self.pool.begin_sync(rid, v)
        return SyncReplica(rid, v)

    def move(self, traj_id: int, to: int) -> MoveTrajectory:
        """Continue running attempt ``traj_id`` on replica ``to`` (same version, a free slot)."""
        a = self.ledger.get(traj_id)
        if a is None:
            raise LedgerError(f"trajectory {traj_id} is not live; it cannot move")
        src = a.replica
        self.pool.move(traj_id, src, to)
        self.ledger.move(traj_id, to)
        return MoveTrajectory(traj_id, src, to, a.version)

    def finished(self, traj_id: int) -> Attempt | None:
        """Free the attempt's slot. None for an attempt that already ended (its replica died)."""
        a = self.ledger.get(traj_id)
        if a is None:
            log.debug("ignoring the end of trajectory %d: it already ended", traj_id)
            return None
        self.pool.remove(a.replica, traj_id)
        return a

    def died(self, event: ReplicaDied) -> tuple[list[Action], list[tuple[int, Prompt | None]]]:
        """Every in-flight attempt of the dead replica is re-queued or failed; none is lost.
        Returns the actions and ``(traj_id, retry or None)`` per attempt for the caller to route
        (see :meth:`lost`)."""
        out: list[Action] = []
        routed: list[tuple[int, Prompt | None]] = []
        if self.pool[event.replica].status is ReplicaStatus.DEAD:
            return out, routed
        for tid in sorted(self.pool.die(event.replica)):
            actions, retry = self.lost(tid, event.cause)
            out += actions
            routed.append((tid, retry))
        return out, routed

    def restarted(self, rid: int, version: int | None = None) -> list[Action]:
        """Sync a restarted replica to ``version`` (default: the newest) before it serves."""
        if self.pool[rid].status is not ReplicaStatus.DEAD:
            return []
        return [self.sync(rid, version)]

    # ------------------------------------------------------------ failures

    def lost(self, traj_id: int, cause: str) -> tuple[list[Action], Prompt | None]:
        """A failed attempt: returns its request's retry for the caller to queue, or None when the
        request has failed ``max_failures`` times and is recorded failed."""
        a = self.ledger.get(traj_id)
        if a is None:
            raise LedgerError(f"trajectory {traj_id} is not live")
        self.failures[a.prompt.key] += 1
        if self.failures[a.prompt.key] >= self.config.max_failures:
            self.ledger.fail(traj_id, cause)
            return [RecordFailed(traj_id, a.prompt, cause)], None
        self.ledger.requeue(traj_id, cause)
        return [Requeue(traj_id, a.prompt, cause)], a.prompt.retry()

    def requeue(self, retry: Prompt | None) -> None:
        """Queue a request's retry first in line (group size 1 modes; None: nothing to queue)."""
        if retry is not None:
            self.retries.appendleft(retry)

    def lost_requeued(self, traj_id: int, cause: str) -> list[Action]:
        """:meth:`lost`, its retry queued first in line (group size 1 modes)."""
        actions, retry = self.lost(traj_id, cause)
        self.requeue(retry)
        return actions

    def died_requeued(self, event: ReplicaDied) -> list[Action]:
        """:meth:`died`, every retry queued first in line (group size 1 modes)."""
        actions, routed = self.died(event)
        for _, retry in routed:
            self.requeue(retry)
        return actions

    def drop_stale(self, traj_id: int, staleness: int) -> tuple[list[Action], Prompt]:
        """Drop a finished, too-stale attempt; returns the retry of its request (not a failure)."""
        a = self.ledger.requeue(traj_id, "stale")
        reason = f"staleness {staleness} > {self.config.staleness}"
        return [Discard(traj_id, reason), Requeue(traj_id, a.prompt, "stale")], a.prompt.retry()

    def check(self, queued: Iterable[tuple[int, int]] = ()) -> None:
        self.ledger.check([p.key for p in self.retries] + list(queued))
        for r in self.pool:
            for tid in r.in_flight:
                a = self.ledger.get(tid)
                if a is None or a.replica != r.rid:
                    raise LedgerError(f"replica {r.rid} holds trajectory {tid}, which the ledger does not place there")

    def stats(self) -> dict[str, float]:
        out = self.ledger.summary()
        out["learner/version"] = float(self.published)
        out["rollout/in_flight"] = float(self.pool.in_flight)
        return out
