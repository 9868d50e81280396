"""The simulator's fleet: its engines and the trajectories running on them.

:class:`SimFleet` executes what the scheduler asks of the replicas (start a trajectory, load
weights) and plays every trajectory turn by turn: a turn decodes on an engine, the environment
answers after its latency, the next turn is routed (:class:`~sao.rl.rollout.sim.routing.TurnPlacer`;
by default it stays on the replica it started on) and pays for the prefix its replica does not
cache. A running trajectory may move to another replica of its version (``MoveTrajectory``,
:meth:`SimFleet.move`). Engines pause for syncs, die and come back. Whatever the scheduler must learn goes out
through ``deliver`` (:mod:`sao.rl.rollout.schedulers.core` events); the fleet's own timed events go on the
simulator's heap through ``push``.

C1 with routing: in modes that keep one version per trajectory, a turn only runs on replicas of
its trajectory's version, and a replica running others' routed turns loads new weights only when
they end (the sync waits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sao.rl.errors import SimError
from sao.rl.rollout.schedulers import (
    Event,
    MoveTrajectory,
    Prompt,
    ReplicaDied,
    StartTrajectory,
    SyncDone,
    SyncReplica,
    TrajectoryFinished,
)
from sao.rl.rollout.schedulers import LengthStats
from sao.rl.rollout.sim.config import SimConfig
from sao.rl.rollout.sim.engine_model import SimEngine, TrajectorySpec, sample_trajectory
from sao.rl.rollout.sim.events import EngineDue, EnvAnswered, SimEvent, SyncLanded
from sao.rl.rollout.sim.routing import Slot, TurnPlacer
from sao.rl.rollout.sim.trainer import Audit, Finished


@dataclass
class _Traj:
    """A trajectory running on a simulated engine. ``engine``: its home (where the scheduler
    started it); ``at``: where its current or last turn runs; ``context``: tokens before its
    current turn's new input."""

    tid: int
    prompt: Prompt
    engine: int
    spec: TrajectorySpec
    versions: list[int]
    turn: int = 0
    at: int = 0
    context: int = 0


class SimFleet:
    """The engines and their trajectories (module docstring). ``clock`` reads the simulator's time."""

    def __init__(self, name: str, config: SimConfig, n: int, capacity: int, one_version: bool, *,
                 clock: Callable[[], float], push: Callable[[float, SimEvent], None],
                 deliver: Callable[[Event], None], audit: Audit, lengths: LengthStats, record: bool) -> None:
        self.name, self.config, self.one_version = name, config, one_version
        self._clock, self._push, self._deliver = clock, push, deliver
        self.audit, self.lengths, self.record = audit, lengths, record
        self.engines = [SimEngine(i, config.engine) for i in range(n)]
        self.placer = TurnPlacer(config.routing, n, capacity, one_version)
        self.on_engine: list[set[int]] = [set() for _ in range(n)]  # home replica -> its trajectories
        self.trajs: dict[int, _Traj] = {}
        self.finished: dict[int, Finished] = {}
        self.generated_tokens = 0
        self.moves = 0  # MoveTrajectory executed
        self.move_prefill_tokens = 0  # prefix tokens recomputed on the targets of mid-turn moves
        self._pending_sync: dict[int, SyncReplica] = {}  # C1 modes: waits for routed turns of others to end
        self._dirty: set[int] = set()
        self._state = ["idle"] * n
        self._since = [0.0] * n
        self.segments: dict[int, list[tuple[float, float, str]]] = {i: [] for i in range(n)}

    # ------------------------------------------------------------ the scheduler's actions

    def start(self, a: StartTrajectory) -> None:
        now, e = self._clock(), self.engines[a.replica]
        if not e.alive or e.paused or e.version != a.version:
            raise SimError(f"{self.name}: StartTrajectory on replica {a.replica} believed at version {a.version}, "
                           f"but it is {'dead' if not e.alive else 'syncing' if e.paused else f'at {e.version}'}")
        spec = sample_trajectory(self.config.workload, self.config.engine, a.prompt, self.config.seed)
        self.trajs[a.traj_id] = _Traj(a.traj_id, a.prompt, a.replica, spec, [e.version], at=a.replica)
        self.on_engine[a.replica].add(a.traj_id)
        self.lengths.on_admitted(spec.action_tokens)
        self.placer.prefill(a.replica, a.traj_id, 0, 0, spec.turns[0].prefill_tokens)
        e.add(a.traj_id, spec.turns[0].work, now)
        self._changed(a.replica)

    def move(self, a: MoveTrajectory) -> None:
        """Continue trajectory ``a.traj_id`` on ``a.to_replica`` (:func:`move_trajectory`)."""
        move_trajectory(self, a)

    def sync(self, a: SyncReplica) -> None:
        now, e = self._clock(), self.engines[a.replica]
        if not e.alive:
            raise SimError(f"{self.name}: SyncReplica to dead replica {a.replica}")
        if self.one_version and self._guests(a.replica):
            self._pending_sync[a.replica] = a  # C1: the routed turns of others end first
            self._changed(a.replica)
            return
        if self.config.routing.flush_on_sync:  # the weights change: no turn may reuse the old KV
            self.placer.flush(a.replica)
        e.sync_token += 1
        if not e.paused:
            e.pause(now)
        self._changed(a.replica)
        self._push(now + self.config.engine.sync_s, SyncLanded(a.replica, a.version, e.sync_token))

    # ------------------------------------------------------------ the fleet's own events

    def turns_due(self, rid: int, epoch: int) -> None:
        e = self.engines[rid]
        if epoch == e.epoch and e.alive:
            for tid in e.pop_finished(self._clock()):
                self._turn_done(tid, rid)
            self._changed(rid)

    def env_answered(self, tid: int) -> None:
        tr = self.trajs.get(tid)
        if tr is None:
            return  # its replica died meanwhile
        tr.turn += 1
        turn = tr.spec.turns[tr.turn]
        rid = self.placer.place(tr.tid, tr.turn, tr.context, tr.engine, tr.at, tuple(tr.versions), self._slot)
        tr.at = rid
        e = self.engines[rid]
        if not e.paused and tr.versions[-1] != e.version:
            tr.versions.append(e.version)  # a paused engine records the version it resumes with
        missing = self.placer.prefill(rid, tr.tid, tr.turn, tr.context, turn.prefill_tokens)
        e.add(tr.tid, turn.work + missing * self.config.engine.prefill_cost, self._clock())
        self._changed(rid)

    def sync_landed(self, rid: int, version: int, token: int) -> None:
        e = self.engines[rid]
        if not e.alive or token != e.sync_token:
            return
        e.resume(self._clock(), version)
        for tid in e.decoding_ids():  # in-flight requests resume on the new weights
            vs = self.trajs[tid].versions
            if vs[-1] != version:
                vs.append(version)
        self._changed(rid)
        self._deliver(SyncDone(rid, version))

    def die(self, rid: int) -> bool:
        """Engine ``rid`` fails with everything on it; False when it was already dead."""
        now, e = self._clock(), self.engines[rid]
        if not e.alive:
            return False
        guests = [t for t in e.kill(now) if self.trajs[t].engine != rid]
        self._pending_sync.pop(rid, None)
        self.placer.flush(rid)
        for tid in self.on_engine[rid]:
            tr = self.trajs.pop(tid)  # a pending environment answer for it is ignored
            self.placer.forget(tid)
            if tr.at != rid and tid in self.engines[tr.at].decoding_ids():  # its turn ran elsewhere
                self.engines[tr.at].remove(tid, now)
                self._changed(tr.at)
        self.audit.killed += len(self.on_engine[rid])
        self.on_engine[rid].clear()
        self._changed(rid)
        self._deliver(ReplicaDied(rid))
        for tid in guests:  # a routed turn died with this replica: its episode fails (re-queued)
            if tid in self.trajs:
                self._end(self.trajs[tid], failed=True, cause="replica died under a routed turn")
        return True

    def back(self, rid: int) -> None:
        self.engines[rid].restart(self._clock())
        self._changed(rid)

    def reschedule(self) -> None:
        """Push the next completion of every engine that changed (and mark the timeline)."""
        for rid in self._dirty:
            e = self.engines[rid]
            t = e.next_completion()
            if t is not None:
                self._push(t, EngineDue(rid, e.epoch))
            if self.record:
                self._mark(e)
        self._dirty.clear()

    def close(self, wall: float) -> None:
        """The run ended at ``wall``: bring the engines' counters and the timeline up to it."""
        for e in self.engines:
            e.advance(wall)
            if self.record:
                self.segments[e.rid].append((self._since[e.rid], wall, self._state[e.rid]))

    # ------------------------------------------------------------ internals

    def _turn_done(self, tid: int, rid: int) -> None:
        tr = self.trajs[tid]
        turn = tr.spec.turns[tr.turn]
        self.generated_tokens += turn.response_tokens
        tr.context += turn.prefill_tokens + turn.response_tokens
        self.placer.cached(rid, tid, tr.context)
        if rid in self._pending_sync and not self._guests(rid):
            self.sync(self._pending_sync.pop(rid))
        if tr.spec.fails_at == tr.turn:
            self._end(tr, failed=True)
        elif tr.turn == len(tr.spec.turns) - 1:
            self._end(tr, failed=False)
        else:
            self._push(self._clock() + turn.env_s, EnvAnswered(tid))

    def _end(self, tr: _Traj, failed: bool, cause: str = "episode failed") -> None:
        del self.trajs[tr.tid]
        self.on_engine[tr.engine].discard(tr.tid)
        self.placer.forget(tr.tid)
        versions = tuple(tr.versions)
        if not failed:
            self.finished[tr.tid] = Finished(versions, tr.spec.total_tokens, tr.spec.action_tokens, tr.prompt.key)
            self.lengths.on_generated(tr.spec.action_tokens)
        self._deliver(TrajectoryFinished(tr.tid, versions, tr.spec.action_tokens, failed, cause if failed else ""))

    def _slot(self, rid: int) -> Slot:
        e = self.engines[rid]
        return Slot(e.version, e.decoding, e.alive and not e.paused and rid not in self._pending_sync)

    def _guests(self, rid: int) -> list[int]:
        """Trajectories decoding a routed turn on ``rid`` that the scheduler placed elsewhere."""
        return [t for t in self.engines[rid].decoding_ids() if self.trajs[t].engine != rid]

    def _changed(self, rid: int) -> None:
        """Engine ``rid``'s batch, pause, version or liveness changed."""
        self._dirty.add(rid)
        self.placer.mark(rid)

    def _mark(self, e: SimEngine) -> None:
        now = self._clock()
        state = "dead" if not e.alive else "sync" if e.paused else "busy" if e.decoding else "idle"
        if state != self._state[e.rid]:
            self.segments[e.rid].append((self._since[e.rid], now, self._state[e.rid]))
            self._state[e.rid], self._since[e.rid] = state, now


def move_trajectory(fleet: SimFleet, a: MoveTrajectory) -> None:
    """Continue trajectory ``a.traj_id`` on ``a.to_replica``. Mid-turn on its source, the request is
    cancelled there and the target prefills again its whole sequence so far (context, the turn's
    input, the tokens generated so far) at ``prefill_cost`` each (less what the target caches), then
    decodes the rest of the turn. Between turns (the environment is answering) or while its turn
    runs on another replica (routed), only its home changes: the next turn runs on the target
    and pays its missing prefix there as any turn does (:class:`TurnPlacer`). Its versions do not
    change: the target serves the same version (C1), checked here."""
    now, tid = fleet._clock(), a.traj_id
    tr = fleet.trajs.get(tid)
    if tr is None or tr.engine != a.from_replica:
        raise SimError(f"{fleet.name}: MoveTrajectory of trajectory {tid} from replica {a.from_replica}, "
                       f"which does not run it")
    dst = fleet.engines[a.to_replica]
    if not dst.alive or dst.paused or dst.version != a.version or set(tr.versions) != {a.version}:
        raise SimError(f"{fleet.name}: MoveTrajectory of trajectory {tid} (versions {tr.versions}) to replica "
                       f"{a.to_replica} at version {dst.version}{' (dead)' if not dst.alive else ''}"
                       f"{' (syncing)' if dst.paused else ''}: C1 would break")
    fleet.on_engine[a.from_replica].discard(tid)
    fleet.on_engine[a.to_replica].add(tid)
    tr.engine = a.to_replica
    fleet.moves += 1
    src = fleet.engines[a.from_replica]
    if tr.at == a.from_replica and tid in src.decoding_ids():
        turn = tr.spec.turns[tr.turn]
        left = src.cancel(tid, now)
        decode_left = min(left, float(turn.response_tokens))  # prefill comes first, decoding last
        generated = turn.response_tokens - int(round(decode_left))
        missing = fleet.placer.recompute(a.to_replica, tid, tr.context + turn.prefill_tokens + generated)
        fleet.move_prefill_tokens += missing
        dst.add(tid, decode_left + missing * fleet.config.engine.prefill_cost, now)
        tr.at = a.to_replica
        fleet._changed(a.from_replica)
    fleet._changed(a.to_replica)
