"""A discrete-event simulator that drives the real schedulers on a simulated clock.

The loop is a heap of timed events. The fleet (:mod:`sao.rl.rollout.sim.fleet`) decodes turns on
its engines, the environment answers after its latency, syncs pause an engine, replicas die and
restart at random; the trainer (:mod:`sao.rl.rollout.sim.trainer`) runs ``TrainOn`` micro-batches
in FIFO order. Whenever something
the scheduler must know happens, the simulator sends it the event and executes the actions it
returns -- exactly what a real asyncio driver does with real engines (see :mod:`sao.rl.rollout.schedulers`).

The simulator is also the schedulers' auditor: it computes staleness from the versions its own
engines used, checks that the scheduler's beliefs match its engines (version, liveness), and
counts ``lost`` attempts independently of the scheduler's ledger (:mod:`metrics`).

Modes: the five scheduler names plus five variants: ``sync_grpo`` (the ``sync`` scheduler with
GRPO groups of ``grpo_group_size``: ``pipe``'s baseline), ``async_mask`` and ``async_drop``
(``async`` with the ``mask`` or ``drop`` stale policy whatever the config says) and
``multi_version_lag`` (``multi_version`` with lagged admission: ``admit_lag`` = the config's if
> 0, else k // 2 and at least 1, at most k) and ``multi_version_rebalance`` (``multi_version`` with
``rebalance`` on: running trajectories move between replicas of one old version, ``MoveTrajectory``). ``pipe`` and ``sync_grpo`` use groups; the other
modes sample one rollout per prompt; every mode trains ``steps x batch_size`` trajectories.
"""

from __future__ import annotations

import heapq
import logging
import random
from dataclasses import dataclass, replace

from sao.rl.rollout.schedulers import (
    Action,
    Discard,
    Event,
    MoveTrajectory,
    RecordFailed,
    ReplicaRestarted,
    Requeue,
    StartTrajectory,
    SyncReplica,
    TrainOn,
    TrainStepDone,
    unknown_name,
)
from sao.rl.rollout.schedulers import LengthStats, make_scheduler
from sao.rl.rollout.sim.config import SimConfig
from sao.rl.rollout.sim.events import (
    EngineBack, EngineDies, EngineDue, EnvAnswered, SimEvent, SyncLanded, TrainStepEnds,
)
from sao.rl.rollout.sim.fleet import SimError, SimFleet
from sao.rl.rollout.sim.metrics import SimResult, Timeline
from sao.rl.rollout.sim.trainer import Audit, SimTrainer

__all__ = ["SIM_MODES", "SimError", "SimMode", "Simulation", "simulate"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SimMode:
    """A simulated mode: the scheduler it runs, whether it samples GRPO groups, config overrides,
    and whether it keeps C1 (one version per trajectory; routing then keeps a trajectory's turns on
    replicas of its version)."""

    scheduler: str
    grpo: bool = False
    overrides: tuple[tuple[str, object], ...] = ()
    one_version: bool = True
    lagged: bool = False


SIM_MODES: dict[str, SimMode] = {
    "sync": SimMode("sync"),
    "one_step_off": SimMode("one_step_off"),
    "async": SimMode("async", one_version=False),
    "multi_version": SimMode("multi_version"),
    "multi_version_lag": SimMode("multi_version", lagged=True),
    "multi_version_rebalance": SimMode("multi_version", overrides=(("rebalance", True),)),
    "pipe": SimMode("pipe", grpo=True),
    "sync_grpo": SimMode("sync", grpo=True),
    "async_mask": SimMode("async", overrides=(("stale_policy", "mask"),), one_version=False),
    "async_drop": SimMode("async", overrides=(("stale_policy", "drop"),), one_version=False),
}

class Simulation:
    """One mode on ``n_engines`` replicas; :meth:`run` returns its :class:`SimResult`."""

    def __init__(self, mode: str, config: SimConfig, n_engines: int, record_timeline: bool = False,
                 check_every: int = 0) -> None:
        if mode not in SIM_MODES:
            raise unknown_name("mode", mode, tuple(SIM_MODES))
        if n_engines < 1:
            raise SimError(f"need at least one engine, got {n_engines}")
        spec = SIM_MODES[mode]
        self.mode, self.config, self.n = mode, config, n_engines
        self.sched_config = replace(config.scheduler_for(spec.grpo), **dict(spec.overrides))
        if spec.lagged and self.sched_config.admit_lag == 0:
            k = self.sched_config.staleness
            self.sched_config = replace(self.sched_config, admit_lag=min(k, max(1, k // 2)))
        self.scheduler = make_scheduler(spec.scheduler, self.sched_config, n_engines)
        self.check_every = check_every
        self.now = 0.0
        self._heap: list[tuple[float, int, SimEvent]] = []  # (time, tie-breaking sequence number, event)
        self._seq = 0
        self._fail_rng = random.Random(f"{config.seed}:replica-failures")
        self.audit = Audit()
        self.lengths = LengthStats()
        self.fleet = SimFleet(mode, config, n_engines, self.sched_config.max_concurrency, spec.one_version,
                              clock=lambda: self.now, push=self._push, deliver=self._deliver, audit=self.audit,
                              lengths=self.lengths, record=record_timeline)
        self.trainer = SimTrainer(config.trainer, self.sched_config.staleness, self.audit, self.lengths, record_timeline)
        self.first_start: dict[tuple[int, int], float] = {}
        self.train_log: list[TrainOn] = []  # every TrainOn, in order (tests inspect it)
        self.start_log: list[StartTrajectory] = []
        self.old_starts = 0  # trajectories started on a replica older than the learner
        self._record = record_timeline
        self._last = 0.0
        self._idle = self._wait = 0.0
        self._events = 0

    # ------------------------------------------------------------ the loop

    def run(self, max_time: float = 1e9) -> SimResult:
        if self.config.engine.mtbf_s is not None:
            for e in self.fleet.engines:
                self._push(self._fail_rng.expovariate(1.0 / self.config.engine.mtbf_s), EngineDies(e.rid))
        self._execute(self.scheduler.start(0.0))
        self.fleet.reschedule()
        while self.trainer.steps_done < self.config.steps:
            if not self._heap:
                raise SimError(f"{self.mode}: nothing left to happen at t={self.now:.1f}s after "
                               f"{self.trainer.steps_done}/{self.config.steps} steps (the scheduler stalled)")
            t, _, event = heapq.heappop(self._heap)
            if t > max_time:
                raise SimError(f"{self.mode}: passed max_time={max_time}s after {self.trainer.steps_done} steps")
            self._tick(t)
            self._handle(event)
            self.fleet.reschedule()
            self._events += 1
            if self.check_every and self._events % self.check_every == 0:
                self.scheduler.check()
        self.scheduler.check()
        return _result(self)

    def _push(self, t: float, event: SimEvent) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, event))

    def _tick(self, t: float) -> None:
        dt = t - self._last
        if dt > 0 and self.trainer.job is None:
            self._idle += dt
            if self.fleet.trajs:
                self._wait += dt
        self.now = self._last = t

    def _handle(self, event: SimEvent) -> None:
        match event:
            case EngineDue(rid, epoch):
                self.fleet.turns_due(rid, epoch)
            case EnvAnswered(tid):
                self.fleet.env_answered(tid)
            case SyncLanded(rid, version, token):
                self.fleet.sync_landed(rid, version, token)
            case TrainStepEnds():
                self._train_done()
            case EngineDies(rid):
                if self.fleet.die(rid):
                    self._push(self.now + self.config.engine.restart_s, EngineBack(rid))
            case EngineBack(rid):
                self.fleet.back(rid)
                self._deliver(ReplicaRestarted(rid))
                if self.config.engine.mtbf_s is not None:
                    self._push(self.now + self._fail_rng.expovariate(1.0 / self.config.engine.mtbf_s), EngineDies(rid))
            case _:
                raise SimError(f"{self.mode}: unknown simulator event {event!r}")

    # ------------------------------------------------------------ scheduler boundary

    def _deliver(self, event: Event) -> None:
        self._execute(self.scheduler.on_event(event, self.now))

    def _execute(self, actions: list[Action]) -> None:
        finished = self.fleet.finished
        for a in actions:
            if isinstance(a, StartTrajectory):
                self.fleet.start(a)
                self.first_start.setdefault(a.prompt.key, self.now)
                self.audit.started += 1
                self.old_starts += a.version < self.trainer.steps_done
                self.start_log.append(a)
            elif isinstance(a, SyncReplica):
                self.fleet.sync(a)
            elif isinstance(a, MoveTrajectory):
                self.fleet.move(a)
            elif isinstance(a, TrainOn):
                self.train_log.append(a)
                self.trainer.queue.append(a)
                if self.trainer.job is None:
                    self._train_next()
            elif isinstance(a, Discard):
                self.audit.dropped += 1
                f = finished.pop(a.traj_id, None)
                if f is not None:
                    self.lengths.on_dropped(f.action_tokens)
            elif isinstance(a, Requeue):
                self.audit.end(self.audit.requeued, a.traj_id)
                finished.pop(a.traj_id, None)
            elif isinstance(a, RecordFailed):
                self.audit.end(self.audit.failed, a.traj_id)
                finished.pop(a.traj_id, None)
            else:
                raise SimError(f"{self.mode}: unknown action {a!r}")

    # ------------------------------------------------------------ trainer

    def _train_next(self) -> None:
        self._push(self.trainer.start_next(self.now, self.fleet.finished.pop, self.first_start), TrainStepEnds())

    def _train_done(self) -> None:
        job = self.trainer.finish(self.now)
        if job.final:
            self._deliver(TrainStepDone(job.step + 1))
        if self.trainer.queue and self.trainer.job is None:
            self._train_next()


# ---------------------------------------------------------------- results


def _lost(sim: Simulation) -> int:
    a = sim.audit
    waiting = set(sim.fleet.finished)
    accounted = len(a.trained | a.requeued | a.failed | set(sim.fleet.trajs) | waiting | set(sim.trainer.items))
    ledger_waiting = int(sim.scheduler.stats().get("ledger/waiting", len(waiting)))
    return (a.started - accounted) + a.twice + abs(ledger_waiting - len(waiting))


def _result(sim: Simulation) -> SimResult:
    """The run's :class:`SimResult` (definitions in :mod:`sao.rl.rollout.sim.metrics`)."""
    wall = max(sim.now, 1e-9)
    fleet, t, audit, n = sim.fleet, sim.trainer, sim.audit, sim.n
    fleet.close(wall)
    n_trained = len(audit.trained)
    hist = dict(sorted(t.staleness.items()))
    peak = sim.config.engine.max_aggregate_tps
    cache = fleet.placer.counters
    drain = sim.scheduler.stats().get("multi_version/drain_replica_s", 0.0)
    return SimResult(
        mode=sim.mode,
        engines=n,
        steps=t.steps_done,
        batch_size=sim.sched_config.batch_size,
        group_size=sim.sched_config.group_size,
        wall_s=wall,
        trajectories_per_hour=n_trained / wall * 3600.0,
        tokens_per_s=t.trained_tokens / wall,
        generated_tokens_per_s=fleet.generated_tokens / wall,
        trainer_idle_ratio=sim._idle / wall,
        trainer_wait_ratio=sim._wait / wall,
        engine_busy_ratio=sum(e.busy_s for e in fleet.engines) / (n * wall),
        engine_utilization=sum(e.work_done for e in fleet.engines) / (n * peak * wall),
        max_staleness=max(hist, default=0),
        mean_staleness=sum(s * c for s, c in hist.items()) / max(n_trained, 1),
        staleness_hist=hist,
        masked=t.masked,
        mixed_version=t.mixed,
        rollout_to_train_end_s=sum(t.r2t) / max(len(t.r2t), 1),
        admitted=audit.started,
        trained=n_trained,
        requeued=len(audit.requeued),
        dropped_stale=audit.dropped,
        failed=len(audit.failed),
        killed=audit.killed,
        lost=_lost(sim),
        old_version_starts=sim.old_starts,
        old_version_start_share=sim.old_starts / max(audit.started, 1),
        prefix_cache_hit_rate=cache.hit_rate,
        prefix_turn_hit_rate=cache.turn_hit_rate,
        routed_moves=cache.moved,
        moves=fleet.moves,
        move_prefill_tokens=fleet.move_prefill_tokens,
        drain_replica_s=drain,
        drain_share=drain / (n * wall),
        lengths=sim.lengths.metrics(),
        timeline=Timeline(fleet.segments, t.segments) if sim._record else None,
    )


def simulate(mode: str, config: SimConfig, n_engines: int, record_timeline: bool = False) -> SimResult:
    """Run one mode at one scale."""
    result = Simulation(mode, config, n_engines, record_timeline).run()
    log.info("%s x %d engines: %.0f trajectories/h, trainer idle %.1f%%, max staleness %d", mode, n_engines,
             result.trajectories_per_hour, 100 * result.trainer_idle_ratio, result.max_staleness)
    return result
