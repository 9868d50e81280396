"""The rollout driver's event loop: execute a scheduler's actions on real replicas, feed it their events.

    StartTrajectory(traj, prompt, replica)  -> run one episode on that replica's client (a task)
                                               ... its end -> TrajectoryFinished(versions per turn)
    SyncReplica(replica, version)           -> pause (in-flight requests wait), reload
                                               weights/v{version}, label, reset prefix cache, resume
                                               ... -> SyncDone
    TrainOn(step, trajs, final)             -> a part of the learner's next batch, put on ``batches``
    Discard / Requeue / RecordFailed        -> write the attempt down (nothing is lost)
    MoveTrajectory(traj, from, to)          -> its episode's later requests go to ``to``; the source's
                                               next load first aborts what it runs, and an aborted
                                               request goes on on ``to`` from its partial tokens
                                               (:mod:`sao.rl.rollout.moves`)

One consumer (:meth:`DriverLoop.run`) reads the event queue and calls the scheduler, so the
scheduler needs no lock. Replica health is :class:`~sao.rl.rollout.replica_health.ReplicaHealth`'s; what each
replica serves, :class:`~sao.rl.rollout.served.ServedVersions`' (the driver's loads and the watches' deaths
are applied to it as events).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from sao.agents import RolloutMeta, Trajectory
from sao.agents.loop import episode_seed
from sao.rl.prompts import OpenPrompts
from sao.rl.rollout.failure_streak import FailureStreak
from sao.rl.rollout.moves import Moves
from sao.rl.rollout.replica_health import HealthConfig, Replica, ReplicaHealth
from sao.rl.rollout.schedulers import (
    Discard,
    MoveTrajectory,
    RecordFailed,
    ReplicaDied,
    ReplicaRestarted,
    Requeue,
    Scheduler,
    StartTrajectory,
    SyncDone,
    SyncReplica,
    TrainOn,
    TrajectoryFinished,
)
from sao.rl.learner import failure
from sao.rl.prompts import PromptRef
from sao.rl.rollout.schedulers import UNKNOWN_VERSION, ClosedCounts, LedgerCounts, LengthStats
from sao.rl.rollout.served import ServedVersions
from sao.rl.rollout.sources import RolloutBatch, rollout_meta, rollout_metrics
from sao.rl.rollout.versioned_client import VersionedClient, turn_versions, version_metrics

log = logging.getLogger(__name__)

RunEpisode = Callable[[Any, PromptRef, int, int], Awaitable[Trajectory]]  # (client, prompt, sample, seed)
LoadVersion = Callable[[int, int], Awaitable[None]]  # (replica id, version): load weights/v{version} into it


class TaskSet:
    """The tasks the driver starts (episodes, loads, watches): each dropped when it ends, all cancelled at
    :meth:`aclose`."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class DriverLoop:
    """Runs ``scheduler`` over ``replicas`` (module doc). ``batches`` receives ``(part, ends the step)``."""

    def __init__(self, scheduler: Scheduler, replicas: list[Replica], versions: ServedVersions, prompts: OpenPrompts,
                 *, run_episode: RunEpisode, load: LoadVersion, seed: int,
                 on_trajectory: Callable[[Trajectory], None], health: HealthConfig,
                 on_restart: Callable[[int], None], failing_after: int = 1 << 30):
        self.scheduler, self.replicas, self.versions, self.prompts = scheduler, replicas, versions, prompts
        self.run_episode, self.load, self.seed, self.on_trajectory = run_episode, load, seed, on_trajectory
        self.events: asyncio.Queue[Any] = asyncio.Queue()  # what the scheduler hears, from inside and out
        self.tasks = TaskSet()
        self.spawn = self.tasks.spawn
        self.streak = FailureStreak(failing_after)  # that many failed attempts in a row stop the loop
        self.batches: asyncio.Queue[tuple[RolloutBatch, bool]] = asyncio.Queue()
        self.health = ReplicaHealth(replicas, health, report=self.events.put_nowait, served=versions.apply,
                                    orphan=self._orphan, spawn=self.spawn, on_restart=on_restart)
        self._step_trajectories: list[Trajectory] = []  # parts already released for the step being assembled
        self._finished: dict[int, Trajectory] = {}
        self._running: dict[int, tuple[StartTrajectory, asyncio.Task[Any]]] = {}  # no TrajectoryFinished sent yet
        self.moves = Moves(lambda r: VersionedClient(replicas[r].client, lambda: versions[r], lambda: versions.kv(r)))
        self._failed: list[Trajectory] = []
        self.lengths = LengthStats()  # action tokens of generated, trained and stale-dropped attempts (C2 bias)
        self.carried = ClosedCounts()  # a resumed run's attempts that earlier processes closed (closed_counts)
        self._t0 = self._since_batch = time.monotonic()

    async def run(self) -> None:
        """Start the schedule and the health watcher, then execute actions as events arrive (forever).

        A replica's death and restart before the schedule started (during its warm-up batches,
        :mod:`sao.rl.rollout.off_schedule`, which reloaded it) are not the scheduler's: it starts from the
        replicas as they are, and hears only of one that is still dead."""
        queued = [self.events.get_nowait() for _ in range(self.events.qsize())]
        for event in queued:
            if not isinstance(event, (ReplicaDied, ReplicaRestarted)):
                self.events.put_nowait(event)
        self.spawn(self.health.watch())
        self._execute(self.scheduler.start(self._now()))
        for rid in sorted(self.health.dead):  # its restart, under way, reports ReplicaRestarted
            self.events.put_nowait(ReplicaDied(rid, "dead when the schedule started"))
        while True:
            event = await self.events.get()
            if isinstance(event, BaseException):  # a helper task failed for good
                raise event
            self._execute(self.scheduler.on_event(event, self._now()))
            self.scheduler.check()

    def reschedule(self, scheduler: Scheduler) -> None:
        """Before :meth:`run`: the schedule is ``scheduler``'s (one that starts at a resumed run's version)."""
        self.scheduler = scheduler

    def carry(self, counts: ClosedCounts, lengths: dict[str, Any]) -> None:
        """Before :meth:`run`: earlier processes' closed counts and lengths, which this run goes on from."""
        self.carried = counts
        self.lengths.load_state_dict(lengths)

    def stats(self) -> dict[str, float]:
        return driver_stats(self)

    def closed_counts(self) -> ClosedCounts:
        """The run's attempts that ended for good so far: admitted (less those in flight or waiting, which
        a resumed run admits again), trained, re-queued and failed, earlier processes' included; what a
        resumed run goes on counting from (``carried``). ``lost`` stays this process's own."""
        n, c = LedgerCounts.from_stats(self.scheduler.stats()), self.carried
        return ClosedCounts(admitted=c.admitted + n.admitted - n.open, trained=c.trained + n.trained,
                            requeued=c.requeued + n.requeued, failed=c.failed + n.failed)

    def lost(self) -> int:
        """Admitted attempts in no bucket: admitted - (in flight + waiting + trained + requeued + failed)."""
        n = LedgerCounts.from_stats(self.scheduler.stats())
        return n.admitted - (n.in_flight + n.waiting + n.trained + n.requeued + n.failed)

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _orphan(self, rid: int) -> int:
        """Cancel the episodes in flight on dead replica ``rid`` (the scheduler re-queues or fails them)."""
        orphans = [tid for tid, (start, _) in self._running.items() if start.replica == rid]
        for tid in orphans:
            _, task = self._running.pop(tid)
            task.cancel()
        self.moves.forget(rid, orphans)
        return len(orphans)

    def _move(self, action: MoveTrajectory) -> None:
        """Seat a running episode on its new replica (:mod:`sao.rl.rollout.moves`); ``_running`` follows it."""
        tid, to = action.traj_id, action.to_replica
        running = tid in self._running and to not in self.health.dead
        if self.moves.move(action, running):  # its source died first: its ReplicaDied no longer ends it; this does
            self.events.put_nowait(TrajectoryFinished(tid, (action.version,), 0, True, "its replica died as it moved"))
        elif tid in self._running:  # else it ended, and its TrajectoryFinished is queued
            start, task = self._running.pop(tid)
            if running:
                self._running[tid] = (replace(start, replica=to), task)
            else:  # the target died: its queued ReplicaDied re-queues it
                task.cancel()

    def _execute(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, (StartTrajectory, SyncReplica)) and action.replica in self.health.dead:
                # Decided before the scheduler read the queued ReplicaDied, which ends this attempt
                # (re-queued) or this sync: nothing to run.
                log.debug("skipping %r: replica %d is dead", action, action.replica)
            elif isinstance(action, MoveTrajectory):
                self._move(action)
            elif isinstance(action, StartTrajectory):
                self._running[action.traj_id] = (action, self.spawn(self._episode(action)))
            elif isinstance(action, SyncReplica):
                self.spawn(self._sync(action))
            elif isinstance(action, TrainOn):
                self._train_on(action)
            elif isinstance(action, Discard):
                dropped = self._finished.pop(action.traj_id, None)
                if dropped is not None:
                    self.lengths.on_dropped(dropped.num_action_tokens)
            elif isinstance(action, (Requeue, RecordFailed)):
                t = self._finished.pop(action.traj_id, None)
                if isinstance(action, RecordFailed):
                    self.prompts.close(action.prompt.group_id)
                    if t is not None:
                        self._failed.append(t)
                log.info("trajectory %d %s: %s", action.traj_id,
                         "re-queued" if isinstance(action, Requeue) else "failed", action.cause)
            else:
                raise TypeError(f"unknown action {action!r}")

    async def _episode(self, start: StartTrajectory) -> None:
        rid = start.replica
        ref = self.prompts.refs[start.prompt.group_id]
        seed = episode_seed(self.seed, ref.index, start.prompt.index + 1000 * start.prompt.attempt)
        trajectory: Trajectory | None
        try:
            trajectory = await self.run_episode(self.moves.client(start.traj_id, rid), ref, start.prompt.index, seed)
        except Exception as exc:  # noqa: BLE001 - an episode that raises is a failed attempt, not a dead loop
            log.warning("trajectory %d raised %r; recorded as a failed attempt", start.traj_id, exc)
            trajectory, cause = None, f"episode raised {type(exc).__name__}: {exc}"
        finally:
            rid = self.moves.leave(start.traj_id, rid)  # where it ended: a move seats it elsewhere
        if trajectory is None or trajectory.status != "ok":
            # A crashed engine fails every request on it: see it before the failures count against prompts.
            await self.health.check(rid, at_once=True)
        if start.traj_id not in self._running:
            return  # its replica died meanwhile; the scheduler re-queued or failed the attempt
        del self._running[start.traj_id]
        if trajectory is None:
            self.events.put_nowait(TrajectoryFinished(start.traj_id, (start.version,), 0, True, cause))
            self._count(cause)
            return
        versions = turn_versions(trajectory, start.version)
        trajectory = replace(trajectory, rollout=RolloutMeta(ref.index, min(versions), replica=rid,
                                                             attempt=start.prompt.attempt, traj_id=start.traj_id))
        self.on_trajectory(trajectory)
        self._finished[start.traj_id] = trajectory
        cause = failure(trajectory)
        if cause is None:
            self.lengths.on_generated(trajectory.num_action_tokens)
        self.events.put_nowait(TrajectoryFinished(start.traj_id, versions, trajectory.num_action_tokens,
                                                  cause is not None, cause or ""))
        self._count(cause)

    def _count(self, cause: str | None) -> None:
        """An attempt ended on a live replica: the loop stops once too many in a row failed (FailureStreak)."""
        error = self.streak.ended(cause)
        if error is not None:
            self.events.put_nowait(error)

    async def _sync(self, action: SyncReplica) -> None:
        rid = action.replica
        generation = self.health.generation(rid)
        if self.versions[rid] == UNKNOWN_VERSION:  # restarted: it serves the weights it was launched with
            log.warning("replica %d, restarted, loads version %d before it serves again", rid, action.version)
        try:
            await self.moves.drain(rid, self.replicas[rid].control)  # a move emptied it: abort what it runs
            await self.load(rid, action.version)
        except Exception as exc:  # noqa: BLE001 - a replica that cannot load weights is treated as dead
            if self.health.current(rid, generation):
                log.warning("replica %d failed to load version %d: %r", rid, action.version, exc)
                self.health.declare_dead(rid, f"weight reload failed: {exc}")
            return
        if self.health.current(rid, generation):
            self.events.put_nowait(SyncDone(rid, action.version))

    def _train_on(self, action: TrainOn) -> None:
        trajectories = tuple(self._finished.pop(t) for t in action.traj_ids)
        self._step_trajectories += trajectories
        metrics: dict[str, float] = {}
        if action.final:
            step, self._step_trajectories = self._step_trajectories, []
            for t in step:
                self.lengths.on_trained(t.num_action_tokens)
            staleness = [action.step - rollout_meta(t).policy_version for t in step]
            wall, self._since_batch = time.monotonic() - self._since_batch, time.monotonic()
            metrics = {**rollout_metrics(step, step, wall), **self.stats(), **self.lengths.metrics(),
                       **version_metrics(step, action.step),
                       "rollout/batch_staleness_max": float(max(staleness)),
                       "rollout/old_kv_turns": float(sum(turn.old_kv for t in step for turn in t.turns)),  # served.py
                       "rollout/batch_staleness_mean": sum(staleness) / len(staleness)}
        failed, self._failed = tuple(self._failed), []
        self.batches.put_nowait((RolloutBatch(trajectories, failed, (), metrics), action.final))


def driver_stats(loop: DriverLoop) -> dict[str, float]:
    """The driver's ``rollout/`` and ``engine/`` metrics: the ledger's counts (with a resumed run's
    earlier ones), replica health, the versions served and the moves executed."""
    s, c = loop.scheduler.stats(), loop.carried
    n = LedgerCounts.from_stats(s)
    dead = loop.health.dead
    live = loop.versions.live(dead)
    return {
        "rollout/staleness_max": s.get("staleness/max", 0.0),
        "rollout/staleness_mean": s.get("staleness/mean", 0.0),
        "rollout/lost": float(loop.lost()),
        "rollout/requeued": n.requeued + c.requeued,
        "rollout/admitted": n.admitted + c.admitted,
        "rollout/trained": n.trained + c.trained,
        "rollout/failed_total": n.failed + c.failed,
        "rollout/in_flight": s.get("rollout/in_flight", 0.0),
        "rollout/replica_deaths": float(loop.health.deaths),
        "rollout/replica_restarts": float(loop.health.restarts),
        "rollout/replicas_live": float(len(loop.replicas) - len(dead)),
        "rollout/prefix_reset_refused": float(loop.versions.refused_resets),
        "engine/weight_version": float(max(live)),
        "engine/weight_version_min": float(min(live)),
        **{k: v for k, v in s.items() if k.startswith("multi_version/")},  # the moves planned, among others
        **loop.moves.stats(),
    }
