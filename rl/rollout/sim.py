"""A discrete-event simulator that drives the real schedulers on a simulated clock.

The loop is a heap of timed events. Engines (:class:`~sao.rl.rollout.engine_model.SimEngine`)
decode turns, the environment answers after its latency, syncs pause an engine, the trainer runs
``TrainOn`` micro-batches in FIFO order, and replicas die and restart at random. Whenever something
the scheduler must know happens, the simulator sends it the event and executes the actions it
returns -- exactly what a real asyncio driver does with real engines (see :mod:`sao.rl.rollout`).

The simulator is also the schedulers' auditor: it computes staleness from the versions its own
engines used, checks that the scheduler's beliefs match its engines (version, liveness), and
counts ``lost`` attempts independently of the scheduler's ledger (:mod:`metrics`).

Modes: the five scheduler names plus two variants: ``sync_grpo`` (the ``sync`` scheduler with
GRPO groups of ``grpo_group_size``: ``pipe``'s baseline) and ``async_mask`` (``async`` with the
``mask`` stale policy whatever the config says). ``pipe`` and ``sync_grpo`` use groups; the other
modes sample one rollout per prompt; every mode trains ``steps x batch_size`` trajectories.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import Counter, deque
from dataclasses import dataclass, field, replace

from sao.rl.rollout.core import (
    Action,
    Discard,
    Event,
    Prompt,
    RecordFailed,
    ReplicaDied,
    ReplicaRestarted,
    Requeue,
    RolloutError,
    StartTrajectory,
    SyncDone,
    SyncReplica,
    TrainOn,
    TrainStepDone,
    TrajectoryFinished,
    unknown_name,
)
from sao.rl.rollout.engine_model import SimEngine, TrajectorySpec, sample_trajectory
from sao.rl.rollout.metrics import SimResult, Timeline
from sao.rl.rollout.modes import make_scheduler
from sao.rl.rollout.sim_events import EngineBack, EngineDies, EngineDue, EnvAnswered, SimEvent, SyncLanded, TrainStepEnds
from sao.rl.rollout.simconfig import SimConfig

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SimMode:
    """A simulated mode: the scheduler it runs, whether it samples GRPO groups, config overrides."""

    scheduler: str
    grpo: bool = False
    overrides: tuple[tuple[str, object], ...] = ()


SIM_MODES: dict[str, SimMode] = {
    "sync": SimMode("sync"),
    "one_step_off": SimMode("one_step_off"),
    "async": SimMode("async"),
    "multi_version": SimMode("multi_version"),
    "pipe": SimMode("pipe", grpo=True),
    "sync_grpo": SimMode("sync", grpo=True),
    "async_mask": SimMode("async", overrides=(("stale_policy", "mask"),)),
}

class SimError(RolloutError):
    """The simulation could not go on: a scheduler stalled or contradicted the engines."""


@dataclass
class _Traj:
    """A trajectory running on a simulated engine."""

    tid: int
    prompt: Prompt
    engine: int
    spec: TrajectorySpec
    versions: list[int]
    turn: int = 0


@dataclass
class _Finished:
    """What the trainer and the metrics need of a finished trajectory until it is trained or dropped."""

    versions: tuple[int, ...]
    total_tokens: int
    action_tokens: int
    key: tuple[int, int]


@dataclass
class _Audit:
    """The driver-side account of every attempt (see ``lost`` in :mod:`metrics`)."""

    started: int = 0
    trained: set[int] = field(default_factory=set)
    requeued: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    dropped: int = 0
    killed: int = 0
    twice: int = 0

    def end(self, bucket: set[int], tid: int) -> None:
        if tid in self.trained or tid in self.requeued or tid in self.failed:
            self.twice += 1
        bucket.add(tid)


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
        self.scheduler = make_scheduler(spec.scheduler, self.sched_config, n_engines)
        self.engines = [SimEngine(i, config.engine) for i in range(n_engines)]
        self.on_engine: list[set[int]] = [set() for _ in range(n_engines)]
        self.check_every = check_every
        self.now = 0.0
        self._heap: list[tuple[float, int, SimEvent]] = []  # (time, tie-breaking sequence number, event)
        self._seq = 0
        self._dirty: set[int] = set()
        self._fail_rng = random.Random(f"{config.seed}:replica-failures")
        self.trajs: dict[int, _Traj] = {}
        self.finished: dict[int, _Finished] = {}
        self.first_start: dict[tuple[int, int], float] = {}
        self.audit = _Audit()
        self.train_log: list[TrainOn] = []  # every TrainOn, in order (tests inspect it)
        self.start_log: list[StartTrajectory] = []
        # trainer
        self._queue: deque[TrainOn] = deque()
        self._training: TrainOn | None = None
        self._step_start: float | None = None
        self._step_items: dict[int, tuple[int, _Finished]] = {}  # given to the trainer, step not done yet
        self.steps_done = 0
        # accumulators
        self._last = 0.0
        self._idle = self._wait = 0.0
        self._trained_tokens = self._generated_tokens = 0
        self.staleness: Counter[int] = Counter()
        self.masked = self.mixed = 0
        self._r2t: list[float] = []
        self._events = 0
        # timeline
        self._record = record_timeline
        self._state = ["idle"] * n_engines
        self._since = [0.0] * n_engines
        self._segments: dict[int, list[tuple[float, float, str]]] = {i: [] for i in range(n_engines)}
        self._trainer_segments: list[tuple[float, float, int]] = []

    # ------------------------------------------------------------ the loop

    def run(self, max_time: float = 1e9) -> SimResult:
        if self.config.engine.mtbf_s is not None:
            for e in self.engines:
                self._push(self._fail_rng.expovariate(1.0 / self.config.engine.mtbf_s), EngineDies(e.rid))
        self._execute(self.scheduler.start(0.0))
        self._flush()
        while self.steps_done < self.config.steps:
            if not self._heap:
                raise SimError(f"{self.mode}: nothing left to happen at t={self.now:.1f}s after "
                               f"{self.steps_done}/{self.config.steps} steps (the scheduler stalled)")
            t, _, event = heapq.heappop(self._heap)
            if t > max_time:
                raise SimError(f"{self.mode}: passed max_time={max_time}s after {self.steps_done} steps")
            self._tick(t)
            self._handle(event)
            self._flush()
            self._events += 1
            if self.check_every and self._events % self.check_every == 0:
                self.scheduler.check()
        self.scheduler.check()
        return self._result()

    def _push(self, t: float, event: SimEvent) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, event))

    def _tick(self, t: float) -> None:
        dt = t - self._last
        if dt > 0 and self._training is None:
            self._idle += dt
            if self.trajs:
                self._wait += dt
        self.now = self._last = t

    def _handle(self, event: SimEvent) -> None:
        match event:
            case EngineDue(rid, epoch):
                e = self.engines[rid]
                if epoch == e.epoch and e.alive:
                    for tid in e.pop_finished(self.now):
                        self._turn_done(tid)
                    self._dirty.add(rid)
            case EnvAnswered(tid):
                tr = self.trajs.get(tid)
                if tr is not None:
                    self._next_turn(tr)
            case SyncLanded(rid, version, token):
                self._sync_done(rid, version, token)
            case TrainStepEnds():
                self._train_done()
            case EngineDies(rid):
                self._die(rid)
            case EngineBack(rid):
                self.engines[rid].restart(self.now)
                self._dirty.add(rid)
                self._deliver(ReplicaRestarted(rid))
                if self.config.engine.mtbf_s is not None:
                    self._push(self.now + self._fail_rng.expovariate(1.0 / self.config.engine.mtbf_s), EngineDies(rid))
            case _:
                raise SimError(f"{self.mode}: unknown simulator event {event!r}")

    def _flush(self) -> None:
        """Reschedule the next completion of every engine that changed."""
        for rid in self._dirty:
            e = self.engines[rid]
            t = e.next_completion()
            if t is not None:
                self._push(t, EngineDue(rid, e.epoch))
            if self._record:
                self._mark(e)
        self._dirty.clear()

    def _mark(self, e: SimEngine) -> None:
        state = "dead" if not e.alive else "sync" if e.paused else "busy" if e.decoding else "idle"
        if state != self._state[e.rid]:
            self._segments[e.rid].append((self._since[e.rid], self.now, self._state[e.rid]))
            self._state[e.rid], self._since[e.rid] = state, self.now

    # ------------------------------------------------------------ scheduler boundary

    def _deliver(self, event: Event) -> None:
        self._execute(self.scheduler.on_event(event, self.now))

    def _execute(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, StartTrajectory):
                self._start(a)
            elif isinstance(a, SyncReplica):
                self._sync(a)
            elif isinstance(a, TrainOn):
                self.train_log.append(a)
                self._queue.append(a)
                if self._training is None:
                    self._train_next()
            elif isinstance(a, Discard):
                self.audit.dropped += 1
                self.finished.pop(a.traj_id, None)
            elif isinstance(a, Requeue):
                self.audit.end(self.audit.requeued, a.traj_id)
                self.finished.pop(a.traj_id, None)
            elif isinstance(a, RecordFailed):
                self.audit.end(self.audit.failed, a.traj_id)
                self.finished.pop(a.traj_id, None)
            else:
                raise SimError(f"{self.mode}: unknown action {a!r}")

    # ------------------------------------------------------------ engines and trajectories

    def _start(self, a: StartTrajectory) -> None:
        e = self.engines[a.replica]
        if not e.alive or e.paused or e.version != a.version:
            raise SimError(f"{self.mode}: StartTrajectory on replica {a.replica} believed at version {a.version}, "
                           f"but it is {'dead' if not e.alive else 'syncing' if e.paused else f'at {e.version}'}")
        spec = sample_trajectory(self.config.workload, self.config.engine, a.prompt, self.config.seed)
        tr = _Traj(a.traj_id, a.prompt, a.replica, spec, [e.version])
        self.trajs[a.traj_id] = tr
        self.on_engine[a.replica].add(a.traj_id)
        self.first_start.setdefault(a.prompt.key, self.now)
        self.audit.started += 1
        self.start_log.append(a)
        e.add(a.traj_id, spec.turns[0].work, self.now)
        self._dirty.add(a.replica)

    def _turn_done(self, tid: int) -> None:
        tr = self.trajs[tid]
        turn = tr.spec.turns[tr.turn]
        self._generated_tokens += turn.response_tokens
        if tr.spec.fails_at == tr.turn:
            self._end(tr, failed=True)
        elif tr.turn == len(tr.spec.turns) - 1:
            self._end(tr, failed=False)
        else:
            self._push(self.now + turn.env_s, EnvAnswered(tid))

    def _next_turn(self, tr: _Traj) -> None:
        tr.turn += 1
        e = self.engines[tr.engine]
        if not e.paused and tr.versions[-1] != e.version:
            tr.versions.append(e.version)  # a paused engine records the version it resumes with
        e.add(tr.tid, tr.spec.turns[tr.turn].work, self.now)
        self._dirty.add(tr.engine)

    def _end(self, tr: _Traj, failed: bool) -> None:
        del self.trajs[tr.tid]
        self.on_engine[tr.engine].discard(tr.tid)
        versions = tuple(tr.versions)
        if not failed:
            self.finished[tr.tid] = _Finished(versions, tr.spec.total_tokens, tr.spec.action_tokens, tr.prompt.key)
        self._deliver(TrajectoryFinished(tr.tid, versions, tr.spec.action_tokens, failed,
                                         "episode failed" if failed else ""))

    def _sync(self, a: SyncReplica) -> None:
        e = self.engines[a.replica]
        if not e.alive:
            raise SimError(f"{self.mode}: SyncReplica to dead replica {a.replica}")
        e.sync_token += 1
        if not e.paused:
            e.pause(self.now)
        self._dirty.add(a.replica)
        self._push(self.now + self.config.engine.sync_s, SyncLanded(a.replica, a.version, e.sync_token))

    def _sync_done(self, rid: int, version: int, token: int) -> None:
        e = self.engines[rid]
        if not e.alive or token != e.sync_token:
            return
        e.resume(self.now, version)
        for tid in e.decoding_ids():  # in-flight requests resume on the new weights
            vs = self.trajs[tid].versions
            if vs[-1] != version:
                vs.append(version)
        self._dirty.add(rid)
        self._deliver(SyncDone(rid, version))

    def _die(self, rid: int) -> None:
        e = self.engines[rid]
        if not e.alive:
            return
        e.kill(self.now)
        for tid in self.on_engine[rid]:
            del self.trajs[tid]  # a pending environment answer for it is ignored
        self.audit.killed += len(self.on_engine[rid])
        self.on_engine[rid].clear()
        self._dirty.add(rid)
        self._deliver(ReplicaDied(rid))
        self._push(self.now + self.config.engine.restart_s, EngineBack(rid))

    # ------------------------------------------------------------ trainer

    def _train_next(self) -> None:
        job = self._queue.popleft()
        self._training = job
        tokens = 0
        for tid in job.traj_ids:
            f = self.finished.pop(tid, None)
            if f is None:
                raise SimError(f"{self.mode}: TrainOn names trajectory {tid}, which is not finished and waiting")
            if tid in self._step_items:
                self.audit.twice += 1
            self._step_items[tid] = (job.step, f)
            tokens += f.total_tokens
            start = self.first_start.pop(f.key, self.now)
            self._step_start = start if self._step_start is None else min(self._step_start, start)
        duration = tokens / self.config.trainer.tokens_per_s
        if job.final:
            duration += self.config.trainer.step_overhead_s
        if self._record:
            self._trainer_segments.append((self.now, self.now + duration, job.step))
        self._push(self.now + duration, TrainStepEnds())

    def _train_done(self) -> None:
        job, self._training = self._training, None
        assert job is not None
        if job.final:
            self._commit_step()
            self.steps_done += 1
            self._r2t.append(self.now - (self._step_start if self._step_start is not None else self.now))
            self._step_start = None
            self._deliver(TrainStepDone(job.step + 1))
        if self._queue and self._training is None:
            self._train_next()

    def _commit_step(self) -> None:
        """The optimizer step is done: its trajectories count as trained (and in the metrics)."""
        k = self.sched_config.staleness
        for tid, (step, f) in self._step_items.items():
            self.audit.end(self.audit.trained, tid)
            s = step - min(f.versions)
            self.staleness[s] += 1
            self.masked += s > k
            self.mixed += len(set(f.versions)) > 1
            self._trained_tokens += f.action_tokens
        self._step_items.clear()

    # ------------------------------------------------------------ results

    def _lost(self) -> int:
        a = self.audit
        waiting = set(self.finished)
        accounted = len(a.trained | a.requeued | a.failed | set(self.trajs) | waiting | set(self._step_items))
        ledger_waiting = int(self.scheduler.stats().get("ledger/waiting", len(waiting)))
        return (a.started - accounted) + a.twice + abs(ledger_waiting - len(waiting))

    def _result(self) -> SimResult:
        wall = max(self.now, 1e-9)
        for e in self.engines:
            e.advance(wall)
        if self._record:
            for e in self.engines:
                self._segments[e.rid].append((self._since[e.rid], wall, self._state[e.rid]))
        n_trained = len(self.audit.trained)
        hist = dict(sorted(self.staleness.items()))
        peak = self.config.engine.max_aggregate_tps
        return SimResult(
            mode=self.mode,
            engines=self.n,
            steps=self.steps_done,
            batch_size=self.sched_config.batch_size,
            group_size=self.sched_config.group_size,
            wall_s=wall,
            trajectories_per_hour=n_trained / wall * 3600.0,
            tokens_per_s=self._trained_tokens / wall,
            generated_tokens_per_s=self._generated_tokens / wall,
            trainer_idle_ratio=self._idle / wall,
            trainer_wait_ratio=self._wait / wall,
            engine_busy_ratio=sum(e.busy_s for e in self.engines) / (self.n * wall),
            engine_utilization=sum(e.work_done for e in self.engines) / (self.n * peak * wall),
            max_staleness=max(hist, default=0),
            mean_staleness=sum(s * c for s, c in hist.items()) / max(n_trained, 1),
            staleness_hist=hist,
            masked=self.masked,
            mixed_version=self.mixed,
            rollout_to_train_end_s=sum(self._r2t) / max(len(self._r2t), 1),
            admitted=self.audit.started,
            trained=n_trained,
            requeued=len(self.audit.requeued),
            dropped_stale=self.audit.dropped,
            failed=len(self.audit.failed),
            killed=self.audit.killed,
            lost=self._lost(),
            timeline=Timeline(self._segments, self._trainer_segments) if self._record else None,
        )


def simulate(mode: str, config: SimConfig, n_engines: int, record_timeline: bool = False) -> SimResult:
    """Run one mode at one scale."""
    result = Simulation(mode, config, n_engines, record_timeline).run()
    log.info("%s x %d engines: %.0f trajectories/h, trainer idle %.1f%%, max staleness %d", mode, n_engines,
             result.trajectories_per_hour, 100 * result.trainer_idle_ratio, result.max_staleness)
    return result
