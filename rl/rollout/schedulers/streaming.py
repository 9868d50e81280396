"""Streaming modes: ``async`` (SAO, METHOD.md 1.10) and ``multi_version`` (DORA, METHOD.md 2).

Both keep the engines busy with single rollouts (group size 1) and hand the trainer a batch as
soon as ``batch_size`` finished trajectories allow one; they differ in how they keep staleness
bounded.

``async``: every replica syncs to the newest version right after each optimizer step, pausing its
in-flight requests for the sync and resuming them on the new weights, so a trajectory may span
versions (the driver reports the version of each turn/token). Admission control: at most
``outstanding_limit`` trajectories are in flight or waiting (AReaL-style, default (k + 1) batches).
The trainer takes finished trajectories in finishing order; one whose oldest version is more than
k behind the learner is dropped and its prompt re-queued (``drop``), or trained anyway and counted
``masked`` (``mask``: the learner's DIS mask handles it).

``multi_version``: C1, C2 and C3 hold by construction.
* C1: a replica changes weights only when it has nothing in flight. After a step, empty replicas
  sync at once; a replica whose version falls more than ``admit_lag`` behind, or whose load is at
  most ``drain_below`` of its capacity, stops admitting (DRAINING) and syncs once empty. New work
  goes to the newest version only (METHOD.md 2; ``admit_lag = 0``, the default), least-loaded
  replica first. With ``admit_lag = N > 0`` it overflows to replicas up to N versions behind while
  their staleness budget allows (the older, lagged admission; an option).
* Rebalancing (``rebalance``, off by default; METHOD.md 2: "a running request can move between
  engines of the same version"): a draining replica of an old version ``v`` that holds at most
  ``drain_below * max_concurrency`` trajectories moves them all (:class:`MoveTrajectory`) to other live
  replicas of ``v`` with free slots, most loaded first, and syncs at once. Only onto a replica that is
  more loaded (ties: higher id), so a trajectory never moves back and every move empties a replica;
  only when every one of the source's trajectories fits, since a half-emptied replica still cannot
  upgrade.
* C2: nothing is dropped or cut for being long.
* C3: let ``N`` be the learner version of the next step; the j-th next step (j = 1, 2, ...) trains
  at ``N + j - 1``, so every untrained trajectory of version ``v`` must be in one of the first
  ``J(v) = v + k - N + 1`` steps. Admission keeps ``#{untrained with J <= j} <= j * batch_size``
  for every j; the trainer fills a batch oldest version first and waits (rather than step past a
  trajectory) while a trajectory with ``J = 1`` is still in flight.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

from sao.rl.rollout.schedulers.book import Book
from sao.rl.rollout.schedulers.core import (
    Action,
    ConfigError,
    Event,
    LedgerError,
    PromptSource,
    ReplicaDied,
    ReplicaRestarted,
    ReplicaStatus,
    SchedulerConfig,
    SyncDone,
    SyncReplica,
    TrainStepDone,
    TrajectoryFinished,
)
from sao.rl.rollout.schedulers.dispatch import dispatch
from sao.rl.rollout.schedulers.rebalance import DrainClock, rebalance_plan

log = logging.getLogger(__name__)


class _SingleRollout:
    """What the two streaming modes share: one rollout per prompt, and after every event the trainer
    takes what it can (``_train``), then new work is admitted (``_admit``)."""

    name = ""

    def __init__(self, config: SchedulerConfig, n_replicas: int, source: PromptSource | None = None,
                 start_version: int = 0) -> None:
        if config.group_size != 1:
            raise ConfigError(f"{self.name} samples one rollout per prompt (SAO); set group_size=1, "
                              f"got {config.group_size} (use `pipe` or `sync` for GRPO groups)")
        self.config = config
        self.book = Book(config, n_replicas, source, start_version)

    def start(self, now: float) -> list[Action]:
        return self._admit(now)

    def on_event(self, event: Event, now: float) -> list[Action]:
        return dispatch(event, self, now) + self._train() + self._admit(now)

    def on_replica_restarted(self, event: ReplicaRestarted) -> list[Action]:
        return self.book.restarted(event.replica)

    def _train(self) -> list[Action]:
        raise NotImplementedError

    def _admit(self, now: float) -> list[Action]:
        raise NotImplementedError


class AsyncScheduler(_SingleRollout):
    """SAO's continuous single-rollout streaming; weights update under running trajectories."""

    name = "async"

    def __init__(self, config: SchedulerConfig, n_replicas: int, source: PromptSource | None = None,
                 start_version: int = 0) -> None:
        super().__init__(config, n_replicas, source, start_version)
        self.waiting: deque[int] = deque()  # finished, in finishing order
        self.masked = 0

    def on_finished(self, event: TrajectoryFinished, now: float) -> list[Action]:
        book = self.book
        if book.finished(event.traj_id) is None:
            return []
        if event.failed:
            return book.lost_requeued(event.traj_id, event.cause or "episode failed")
        book.ledger.finish(event.traj_id, event.versions, event.n_tokens, now)
        self.waiting.append(event.traj_id)
        return []

    def on_step_done(self, event: TrainStepDone, now: float) -> list[Action]:
        book = self.book
        book.step_done(event.version)
        return [book.sync(r.rid) for r in book.pool if r.status is ReplicaStatus.SERVING]

    def on_sync_done(self, event: SyncDone) -> list[Action]:
        book = self.book
        if book.pool.end_sync(event.replica, event.version) and event.version < book.published:
            return [book.sync(event.replica)]  # a newer version came out meanwhile
        return []

    def on_replica_died(self, event: ReplicaDied) -> list[Action]:
        return self.book.died_requeued(event)

    def stats(self) -> dict[str, float]:
        return {**self.book.stats(), "staleness/masked": float(self.masked)}

    def check(self) -> None:
        self.book.check()

    def _train(self) -> list[Action]:
        book, cfg = self.book, self.config
        if book.training or len(self.waiting) < cfg.batch_size:
            return []
        out: list[Action] = []
        batch: list[int] = []
        while self.waiting and len(batch) < cfg.batch_size:
            tid = self.waiting.popleft()
            a = book.ledger.get(tid)
            assert a is not None
            staleness = book.next_step - a.oldest_version
            if staleness > cfg.staleness:
                if cfg.stale_policy == "drop":
                    actions, retry = book.drop_stale(tid, staleness)
                    out += actions
                    book.requeue(retry)
                    continue
                self.masked += 1
            batch.append(tid)
        if len(batch) < cfg.batch_size:
            self.waiting.extendleft(reversed(batch))
            return out
        action, _ = book.train(batch)
        return out + [action]

    def _admit(self, now: float) -> list[Action]:
        book = self.book
        c = book.ledger.counts
        room = self.config.outstanding_limit - c["in_flight"] - c["waiting"]
        if room <= 0:
            return []
        return [book.start(book.next_prompt(), rid, now) for rid in book.pool.assign(room)]


class MultiVersionScheduler(_SingleRollout):
    """DORA: several versions serve at once; C1 (one version per trajectory), C2 (no drops) and
    C3 (staleness <= k) hold by construction (module docstring)."""

    name = "multi_version"

    def __init__(self, config: SchedulerConfig, n_replicas: int, source: PromptSource | None = None,
                 start_version: int = 0) -> None:
        super().__init__(config, n_replicas, source, start_version)
        self.waiting: dict[int, int] = {}  # finished traj id -> version, in finishing order
        self.in_flight: Counter[int] = Counter()  # version -> in-flight trajectories
        self.untrained: Counter[int] = Counter()  # version -> in flight or waiting
        self._version_of: dict[int, int] = {}  # in-flight traj id -> version
        self._blocked: set[int] = set()  # steps the trainer had a batch for but waited on a due trajectory
        self.moves = 0  # MoveTrajectory actions issued (rebalance)
        self._now = 0.0
        self.draining = DrainClock()

    def start(self, now: float) -> list[Action]:
        self._now = now
        return super().start(now)

    def on_event(self, event: Event, now: float) -> list[Action]:
        self._now = now
        return super().on_event(event, now)

    # ------------------------------------------------------------ events

    def on_finished(self, event: TrajectoryFinished, now: float) -> list[Action]:
        book = self.book
        a = book.finished(event.traj_id)
        if a is None:
            return []
        self._leave(event.traj_id)
        out: list[Action] = []
        if event.failed:
            self._forget(a.version)
            out += book.lost_requeued(event.traj_id, event.cause or "episode failed")
        else:
            if any(v != a.version for v in event.versions):
                raise LedgerError(f"C1 broken: trajectory {event.traj_id} started on version {a.version} "
                                  f"but reports versions {sorted(set(event.versions))}")
            book.ledger.finish(event.traj_id, event.versions, event.n_tokens, now)
            self.waiting[event.traj_id] = a.version
        out += self._upkeep(a.replica)
        if a.version < book.published:
            out += self._rebalance(a.version)
        return out

    def on_step_done(self, event: TrainStepDone, now: float) -> list[Action]:
        book = self.book
        book.step_done(event.version)
        out = [action for r in book.pool for action in self._upkeep(r.rid)]
        for v in sorted({r.version for r in book.pool if 0 <= r.version < book.published}):
            out += self._rebalance(v)
        return out

    def on_sync_done(self, event: SyncDone) -> list[Action]:
        return self._upkeep(event.replica) if self.book.pool.end_sync(event.replica, event.version) else []

    def on_replica_died(self, event: ReplicaDied) -> list[Action]:
        self.draining.stop(event.replica, self._now)
        for tid in self.book.pool[event.replica].in_flight:
            self._forget(self._leave(tid))
        return self.book.died_requeued(event)

    def stats(self) -> dict[str, float]:
        versions = {r.version for r in self.book.pool if r.status in (ReplicaStatus.SERVING, ReplicaStatus.DRAINING)}
        return {**self.book.stats(), "multi_version/versions_live": float(len(versions)),
                "multi_version/blocked_steps": float(len(self._blocked)),
                "multi_version/moves": float(self.moves), "multi_version/drain_replica_s": self.drain_s}

    @property
    def drain_s(self) -> float:
        """Replica-seconds spent draining up to the latest event's clock (:class:`.rebalance.DrainClock`)."""
        return self.draining.total(self._now)

    def check(self) -> None:
        self.book.check()
        for r in self.book.pool:
            if r.status is ReplicaStatus.SYNCING and r.in_flight:
                raise LedgerError(f"C1 broken: replica {r.rid} syncs with {len(r.in_flight)} trajectories in flight")
        c = self.book.ledger.counts
        if sum(self.untrained.values()) != c["in_flight"] + c["waiting"] or len(self.waiting) != c["waiting"]:
            raise LedgerError(f"per-version counts {dict(self.untrained)} disagree with the ledger {dict(c)}")
        for r in self.book.pool:  # C1 across moves: a trajectory only ever runs on replicas of its version
            for tid in r.in_flight:
                if self._version_of.get(tid) != r.version:
                    raise LedgerError(f"C1 broken: trajectory {tid} of version {self._version_of.get(tid)} "
                                      f"runs on replica {r.rid} at version {r.version}")

    # ------------------------------------------------------------ internals

    def _leave(self, tid: int) -> int:
        """``tid`` is no longer in flight; returns its version."""
        v = self._version_of.pop(tid)
        self.in_flight[v] -= 1
        if not self.in_flight[v]:
            del self.in_flight[v]
        return v

    def _forget(self, version: int) -> None:
        """One trajectory of ``version`` will not be trained (trained, re-queued or failed)."""
        self.untrained[version] -= 1
        if not self.untrained[version]:
            del self.untrained[version]

    def _upkeep(self, rid: int) -> list[Action]:
        """Upgrade an empty old replica; make a too-old or lightly loaded one drain."""
        book, cfg = self.book, self.config
        r = book.pool[rid]
        if r.status not in (ReplicaStatus.SERVING, ReplicaStatus.DRAINING) or r.version >= book.published:
            return []
        if r.load == 0:
            return [self._sync(rid)]
        if r.version < book.published - cfg.admit_lag or r.load <= cfg.drain_below * cfg.max_concurrency:
            r.status = ReplicaStatus.DRAINING
            self.draining.start(rid, self._now)
        return []

    def _rebalance(self, version: int) -> list[Action]:
        """Empty the lightly loaded draining replicas of old ``version`` into its other replicas (:mod:`.rebalance`)."""
        out: list[Action] = []
        for src, moves in rebalance_plan(self.book.pool, self.config, version) if self.config.rebalance else []:
            out += [self.book.move(tid, dst) for tid, dst in moves]
            self.moves += len(moves)
            out.append(self._sync(src))
        return out

    def _sync(self, rid: int) -> SyncReplica:
        if self.book.pool[rid].in_flight:
            raise LedgerError(f"C1: refusing to sync replica {rid} with trajectories in flight")
        self.draining.stop(rid, self._now)
        return self.book.sync(rid)

    def _due_step(self, version: int) -> int:
        """J(v): a trajectory of ``version`` must be in one of the next J(v) steps."""
        return version + self.config.staleness - self.book.next_step + 1

    def _room(self, version: int) -> int:
        """How many more trajectories may start on ``version`` without breaking C3 later."""
        k, B = self.config.staleness, self.config.batch_size
        first = self._due_step(version)
        if first < 1:
            return 0
        room = None
        for j in range(first, k + 2):
            limit = self.book.next_step + j - 1 - k
            count = sum(n for v, n in self.untrained.items() if v <= limit)
            slack = j * B - count
            room = slack if room is None else min(room, slack)
        return max(room or 0, 0)

    def _admit(self, now: float) -> list[Action]:
        book, cfg = self.book, self.config
        versions = sorted({r.version for r in book.pool if r.status is ReplicaStatus.SERVING}, reverse=True)
        out: list[Action] = []
        for v in versions:
            if v < book.published - cfg.admit_lag:
                break
            room = self._room(v)
            if room <= 0:
                continue
            for rid in book.pool.assign(room, lambda r, v=v: r.version == v):
                action = book.start(book.next_prompt(), rid, now)
                self._version_of[action.traj_id] = v
                self.in_flight[v] += 1
                self.untrained[v] += 1
                out.append(action)
        return out

    def _train(self) -> list[Action]:
        book, cfg = self.book, self.config
        if book.training or len(self.waiting) < cfg.batch_size:
            return []
        order = sorted(self.waiting, key=lambda t: self.waiting[t])  # stable: oldest version, then finishing order
        batch = order[:cfg.batch_size]
        if not self._can_step(batch):
            self._blocked.add(book.next_step)
            return []
        for t in batch:
            self._forget(self.waiting.pop(t))
        action, _ = book.train(batch)
        return [action]

    def _can_step(self, batch: list[int]) -> bool:
        """The step may go ahead if what it leaves keeps the admission invariant one step later:
        ``#{remaining with J <= j + 1} <= j * batch_size`` for j = 0..k (j = 0: nothing due now is
        left behind). Otherwise the trainer waits for older trajectories to finish; once they all
        have, the oldest-first batch always passes, so waiting never deadlocks."""
        k, B, N = self.config.staleness, self.config.batch_size, self.book.next_step
        remaining = Counter(self.untrained)
        for t in batch:
            remaining[self.waiting[t]] -= 1
        for j in range(k + 1):
            limit = N + j - k  # J(v) <= j + 1  <=>  v <= N + j - k
            if sum(n for v, n in remaining.items() if v <= limit) > j * B:
                return False
        return True
