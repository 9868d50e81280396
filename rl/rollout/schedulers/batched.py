"""Batch-at-a-time modes: ``sync``, ``one_step_off`` and ``pipe`` (RolloutPipe).

Each generates one batch of whole groups at a time, all of it on ONE policy version (replicas
admit a batch's requests only while they serve the batch's version), so a trajectory never spans
versions. They differ in when the trainer gets data and when the engines move on:

* ``sync`` (the batch-interleaved baseline, GRPO when ``group_size > 1``): generate the whole
  batch, train on it, sync every replica, start the next batch. Engines idle while the trainer
  and the sync run; the trainer idles while the engines generate. Staleness 0.
* ``one_step_off``: batch n+1 is generated (on version n) while the trainer trains on batch n;
  engines sync between batches. Staleness 1 from the second batch on.
* ``pipe`` (METHOD.md section 4): on-policy like ``sync``, but CGP -- every complete group (all G
  samples finished) enters a FIFO and the trainer consumes ``micro_groups`` groups per
  gradient-accumulation micro-batch while later groups still generate -- and FGD -- requests are
  admitted frontier group first (the oldest group with unstarted requests, retries included), so
  the groups the next micro-batch needs complete first. With ``frontier_first=False`` requests
  are admitted sample-major (sample 0 of every group, then sample 1, ...), the order in which
  groups complete late and together.

A request that fails for good fails its whole group (a partial group has no GRPO baseline): its
finished samples are recorded failed, and a fresh group from the source takes its place.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from sao.rl.rollout.schedulers.book import Book
from sao.rl.rollout.schedulers.core import (
    Action,
    Event,
    LedgerError,
    Prompt,
    PromptSource,
    RecordFailed,
    ReplicaDied,
    ReplicaRestarted,
    ReplicaStatus,
    SchedulerConfig,
    SyncDone,
    TrainStepDone,
    TrajectoryFinished,
)
from sao.rl.rollout.schedulers.dispatch import dispatch

log = logging.getLogger(__name__)


@dataclass
class Group:
    """The G requests of one prompt within a batch."""

    gid: int
    size: int
    pending: deque[Prompt] = field(default_factory=deque)  # not started (retries first)
    running: set[int] = field(default_factory=set)
    done: dict[int, int] = field(default_factory=dict)  # sample index -> finished traj id
    failed: bool = False

    @property
    def complete(self) -> bool:
        return not self.failed and len(self.done) == self.size

    def traj_ids(self) -> tuple[int, ...]:
        return tuple(self.done[i] for i in sorted(self.done))


class GroupBatch:
    """One batch of ``n_groups`` groups generated on ``version``, groups in frontier order."""

    def __init__(self, version: int, n_groups: int, group_size: int, source: PromptSource) -> None:
        self.version = version
        self.group_size = group_size
        self.source = source
        self.groups: dict[int, Group] = {}
        self.shipped = 0  # groups handed to the trainer
        self.n_groups = n_groups
        for _ in range(n_groups):
            self.add_group()

    def add_group(self) -> Group:
        prompts = self.source.next_group(self.group_size)
        g = Group(prompts[0].group_id, self.group_size, deque(prompts))
        self.groups[g.gid] = g
        return g

    def take(self, n: int, frontier_first: bool) -> list[Prompt]:
        """The next ``n`` requests to start: frontier group first, or sample-major."""
        out: list[Prompt] = []
        if frontier_first:
            for g in self.groups.values():
                while g.pending and len(out) < n:
                    out.append(g.pending.popleft())
                if len(out) == n:
                    break
            return out
        pending = sorted((p.index, p.group_id) for g in self.groups.values() for p in g.pending)[:n]
        for _, gid in pending:
            out.append(self.groups[gid].pending.popleft())
        return out

    @property
    def complete(self) -> bool:
        """Every group of the batch is complete (shipped groups counted)."""
        live = [g for g in self.groups.values() if not g.failed]
        return self.shipped + len(live) == self.n_groups and all(g.complete for g in live)

    def queued_keys(self) -> list[tuple[int, int]]:
        """Requests waiting for a retry (already opened in the ledger)."""
        return [p.key for g in self.groups.values() for p in g.pending if p.attempt > 0]


class _BatchMode:
    """The machinery the three batch modes share; subclasses decide what happens when a group or
    the batch completes and when a step is done (the ``_on_*`` hooks)."""

    name = ""
    stream_groups = False  # pipe: admission order matters for the trainer

    def __init__(self, config: SchedulerConfig, n_replicas: int, source: PromptSource | None = None,
                 start_version: int = 0) -> None:
        self.config = config
        self.book = Book(config, n_replicas, source, start_version)
        self.batch: GroupBatch | None = None
        self._group_of: dict[int, Group] = {}
        self._barrier: set[int] = set()  # replicas syncing before the next batch may start
        self._barrier_version = start_version  # the version they sync to: the next batch's
        self._open_after_barrier = False

    # ------------------------------------------------------------ Scheduler protocol

    def start(self, now: float) -> list[Action]:
        return self._open_batch(now)

    def on_event(self, event: Event, now: float) -> list[Action]:
        out = dispatch(event, self, now)
        if self._open_after_barrier and not self._barrier:
            out += self._open_batch(now)
            for r in self.book.pool:
                out += self._realign(r.rid)
        return out + self._admit(now)

    def on_step_done(self, event: TrainStepDone, now: float) -> list[Action]:
        self.book.step_done(event.version)
        return self._after_step(now)

    def on_sync_done(self, event: SyncDone) -> list[Action]:
        if not self.book.pool.end_sync(event.replica, event.version):
            return []
        self._barrier.discard(event.replica)
        return self._realign(event.replica)

    def on_replica_died(self, event: ReplicaDied) -> list[Action]:
        self._barrier.discard(event.replica)
        out, routed = self.book.died(event)
        for tid, retry in routed:
            out += self._route_retry(tid, retry)
        return out

    def on_replica_restarted(self, event: ReplicaRestarted) -> list[Action]:
        return self.book.restarted(event.replica, self._serving_version())

    def stats(self) -> dict[str, float]:
        return self.book.stats()

    def check(self) -> None:
        self.book.check(self.batch.queued_keys() if self.batch else [])

    # ------------------------------------------------------------ shared steps

    def _serving_version(self) -> int:
        if self.batch is not None:
            return self.batch.version
        return self._barrier_version if self._open_after_barrier else self.book.published

    def _realign(self, rid: int) -> list[Action]:
        """A serving replica on another version than the open batch's (restarted meanwhile, or
        synced ahead) is synced to the batch's version; it holds no work of the batch."""
        r = self.book.pool[rid]
        if self.batch is None or r.version == self.batch.version or r.status is not ReplicaStatus.SERVING or r.in_flight:
            return []
        return [self.book.sync(rid, self.batch.version)]

    def _open_batch(self, now: float) -> list[Action]:
        version = self._barrier_version if self._open_after_barrier else self.book.published
        self._open_after_barrier = False
        self.batch = GroupBatch(version, self.config.groups_per_batch, self.config.group_size, self.book.source)
        log.debug("%s: batch for step %d opens on version %d at %.1f s", self.name, self.book.next_step,
                  self.batch.version, now)
        return self._admit(now)

    def _sync_all_then_open(self) -> list[Action]:
        """Sync every live replica to the newest version; the next batch opens when all are done."""
        out = []
        self._barrier_version = self.book.published
        for r in self.book.pool.alive():
            out.append(self.book.sync(r.rid))
            self._barrier.add(r.rid)
        self._open_after_barrier = True
        return out

    def _admit(self, now: float) -> list[Action]:
        b = self.batch
        if b is None:
            return []
        version = b.version
        slots = self.book.pool.free_slots(lambda r: r.version == version)
        prompts = b.take(slots, self.config.frontier_first) if slots else []
        rids = self.book.pool.assign(len(prompts), lambda r: r.version == version)
        out: list[Action] = []
        for p, rid in zip(prompts, rids):
            action = self.book.start(p, rid, now)
            g = b.groups[p.group_id]
            g.running.add(action.traj_id)
            self._group_of[action.traj_id] = g
            out.append(action)
        return out

    def on_finished(self, event: TrajectoryFinished, now: float) -> list[Action]:
        a = self.book.finished(event.traj_id)
        if a is None:
            return []
        g = self._group_of[event.traj_id]
        g.running.discard(event.traj_id)
        if event.failed:
            actions, retry = self.book.lost(event.traj_id, event.cause or "episode failed")
            return actions + self._route_retry(event.traj_id, retry)
        self.book.ledger.finish(event.traj_id, event.versions, event.n_tokens, now)
        if g.failed:
            self._group_of.pop(event.traj_id)
            self.book.ledger.fail(event.traj_id, "group failed")
            return [RecordFailed(event.traj_id, a.prompt, "group failed")]
        if len(set(event.versions)) > 1 or (event.versions and event.versions[0] != a.version):
            raise LedgerError(f"{self.name}: trajectory {event.traj_id} reports versions {event.versions}, "
                              f"but it started on version {a.version} and weights must not change under it")
        g.done[a.prompt.index] = event.traj_id
        out: list[Action] = []
        if g.complete:
            out += self._on_group_complete(g, now)
        if self.batch is not None and self.batch.complete:
            out += self._on_batch_complete(now)
        return out

    def _route_retry(self, tid: int, retry: Prompt | None) -> list[Action]:
        """Put a retry back at the front of its group, or fail the whole group."""
        g = self._group_of.pop(tid)
        g.running.discard(tid)
        if g.failed:
            if retry is not None:
                self.book.ledger.close_failed(retry, "group failed")
            return []
        if retry is not None:
            g.pending.appendleft(retry)
            return []
        return self._fail_group(g)

    def _fail_group(self, g: Group) -> list[Action]:
        out: list[Action] = []
        g.failed = True
        for tid in g.traj_ids():
            a = self.book.ledger.fail(tid, "group failed")
            self._group_of.pop(tid, None)
            out.append(RecordFailed(tid, a.prompt, "group failed"))
        for p in g.pending:
            if p.attempt > 0:
                self.book.ledger.close_failed(p, "group failed")
        g.pending.clear()
        g.done.clear()
        if self.batch is not None and g.gid in self.batch.groups:
            del self.batch.groups[g.gid]
            self.batch.add_group()  # a fresh group keeps the batch at full size
        return out

    def _train(self, groups: list[Group], final: bool) -> list[Action]:
        ids = [tid for g in groups for tid in g.traj_ids()]
        for tid in ids:
            self._group_of.pop(tid, None)
        action, _ = self.book.train(ids, final)
        return [action]

    # ------------------------------------------------------------ hooks

    def _on_group_complete(self, g: Group, now: float) -> list[Action]:
        return []

    def _on_batch_complete(self, now: float) -> list[Action]:
        raise NotImplementedError

    def _after_step(self, now: float) -> list[Action]:
        raise NotImplementedError


class SyncScheduler(_BatchMode):
    """Batch-interleaved baseline: generate, train, sync, repeat."""

    name = "sync"

    def _on_batch_complete(self, now: float) -> list[Action]:
        assert self.batch is not None
        groups, self.batch = list(self.batch.groups.values()), None
        return self._train(groups, final=True)

    def _after_step(self, now: float) -> list[Action]:
        return self._sync_all_then_open()


class OneStepOffScheduler(_BatchMode):
    """Generate batch n+1 on version n while training on batch n; sync between batches."""

    name = "one_step_off"

    def __init__(self, config: SchedulerConfig, n_replicas: int, source: PromptSource | None = None,
                 start_version: int = 0) -> None:
        super().__init__(config, n_replicas, source, start_version)
        self._ready: list[Group] | None = None  # a generated batch waiting for the trainer

    def _on_batch_complete(self, now: float) -> list[Action]:
        assert self.batch is not None
        groups, self.batch = list(self.batch.groups.values()), None
        if self.book.training:
            self._ready = groups  # engines wait: batch n+2 needs version n+1
            return []
        return self._train(groups, final=True) + self._next_batch(now)

    def _after_step(self, now: float) -> list[Action]:
        if self._ready is None:
            return []  # the batch being generated goes on on its version
        groups, self._ready = self._ready, None
        return self._train(groups, final=True) + self._next_batch(now)

    def _next_batch(self, now: float) -> list[Action]:
        stale = any(r.version < self.book.published for r in self.book.pool.alive())
        return self._sync_all_then_open() if stale else self._open_batch(now)


class PipeScheduler(_BatchMode):
    """RolloutPipe: on-policy batches; complete groups stream to the trainer as micro-batches (CGP);
    frontier groups are admitted first (FGD)."""

    name = "pipe"
    stream_groups = True

    def __init__(self, config: SchedulerConfig, n_replicas: int, source: PromptSource | None = None,
                 start_version: int = 0) -> None:
        super().__init__(config, n_replicas, source, start_version)
        self._fifo: deque[Group] = deque()

    def _on_group_complete(self, g: Group, now: float) -> list[Action]:
        assert self.batch is not None
        self._fifo.append(g)
        out: list[Action] = []
        m = self.config.micro_groups
        while self._fifo:
            left = self.batch.n_groups - self.batch.shipped
            take = min(m, left)
            if len(self._fifo) < take:
                break
            groups = [self._fifo.popleft() for _ in range(take)]
            self.batch.shipped += take
            for grp in groups:
                del self.batch.groups[grp.gid]
            out += self._train(groups, final=self.batch.shipped == self.batch.n_groups)
        return out

    def _on_batch_complete(self, now: float) -> list[Action]:
        return []

    def _after_step(self, now: float) -> list[Action]:
        self.batch = None
        return self._sync_all_then_open()
