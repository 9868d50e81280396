"""Asynchronous rollout on real engines: a :mod:`sao.rl.rollout` scheduler driven by asyncio.

:class:`OrchestratedRollout` is a :class:`~sao.rl.sources.RolloutSource` (``next_batch``,
``on_weights``) for ``rollout=one_step_off|async|multi_version|pipe`` (and ``sync``). It feeds the
mode's clock-agnostic scheduler the events of real episodes and replicas, and executes its actions:

    StartTrajectory(traj, prompt, replica)  -> run one episode on that replica's client (a task)
                                               ... its end -> TrajectoryFinished(versions per turn)
    SyncReplica(replica, version)           -> pause (in-flight requests wait), reload
                                               weights/v{version}, label, reset prefix cache, resume
                                               ... -> SyncDone
    TrainOn(step, trajs, final)             -> a part of the learner's next batch (next_parts yields it
                                               at once: pipe's complete groups; next_batch joins them)
    Discard / Requeue / RecordFailed        -> write the attempt down (nothing is lost)

One consumer task reads the event queue and calls the scheduler, so the scheduler needs no lock.
The learner publishes a version by writing its checkpoint (:class:`~sao.rl.sync.WeightPublisher`)
and calling :meth:`on_weights`; the scheduler decides when each replica loads it.

Versions: every turn records the replica's version when its request was sent and when it came
back (a sync can land mid-request: ``pause_mode="keep"`` lets the request continue on the new
weights). The oldest of them is the trajectory's version for staleness (METHOD.md 1.10).

Health: a watcher checks every replica each ``health.interval_s``; one whose process exited
(``Replica.alive``) or whose ``/health`` failed ``health.failures`` times in a row is dead. An
episode that fails also triggers a check at once, so a crash is seen before its failed attempts
count against their prompts. A dead replica -> :class:`ReplicaDied` (the scheduler re-queues or
fails its in-flight attempts; their tasks are cancelled), then ``Replica.restart`` (a managed vLLM
starts again on its port) or, for an external engine, waiting for ``/health`` -> 
:class:`ReplicaRestarted` (the scheduler syncs it to the newest version before it serves).

Start and resume: every replica first loads the learner's version (``weights/v{k}``) -- a resumed
run starts its scheduler at version k. :meth:`state_dict` holds the task cursor and the prompts
admitted but not yet handed to the learner (in flight, finished-untrained, re-queued, or in a batch
not yet taken); a resumed source admits those first, so none is lost and none is trained twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from sao.agents import Completion, Trajectory
from sao.agents.client import CompletionClient, SamplingParams
from sao.rl.rollout import (
    Discard,
    Prompt,
    RecordFailed,
    ReplicaDied,
    ReplicaRestarted,
    Requeue,
    SchedulerConfig,
    StartTrajectory,
    SyncDone,
    SyncReplica,
    TrainOn,
    TrainStepDone,
    TrajectoryFinished,
    make_scheduler,
)
from sao.rl.rollout.replicas import UNKNOWN_VERSION
from sao.rl.sources import RolloutBatch, rollout_metrics
from sao.rl.sync import version_dir
from sao.rl.tasks import PromptRef, episode_seed
from sao.rl.trainable import failure

log = logging.getLogger(__name__)


class ReplicaControl(Protocol):
    """The control endpoints of one engine replica (``EngineClient`` on vLLM)."""

    async def pause(self, *, mode: str = "abort") -> None: ...

    async def resume(self) -> None: ...

    async def reload_weights(self, path: str | Path, *, timeout_s: float | None = None) -> None: ...

    async def set_weight_version(self, version: int | str) -> None: ...

    async def reset_prefix_cache(self) -> bool: ...

    async def health(self) -> bool: ...


@dataclass
class Replica:
    """One engine replica: where completions go, how it is controlled, and what it serves now.

    ``alive``: a cheap liveness check (a managed server's process is running); None for an
    external engine, checked through ``control.health()`` only. ``restart``: start it again (same
    address); None when someone else owns the engine (the watcher then waits for it to come back).
    """

    client: CompletionClient
    control: ReplicaControl
    version: int = 0
    alive: Callable[[], bool] | None = None
    restart: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True)
class HealthConfig:
    """How replicas are watched: a check every ``interval_s``; dead after ``failures`` failed
    ``/health`` calls in a row (each bounded by ``timeout_s``) or at once when ``alive()`` is
    False; at most ``max_restarts`` restarts per replica, after which the rollout loop stops."""

    interval_s: float = 5.0
    failures: int = 3
    timeout_s: float = 10.0
    max_restarts: int = 3


class _VersionedClient:
    """Stamps each completion with the replica's version at request time and at answer time."""

    def __init__(self, replica: Replica):
        self.replica = replica

    @property
    def attempts(self) -> int:
        return getattr(self.replica.client, "attempts", 0)

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        before = self.replica.version
        completion = await self.replica.client.complete(prompt_ids, params)
        after = self.replica.version
        return replace(completion, weight_version=str(before) if before == after else f"{before}-{after}")


def turn_versions(trajectory: Trajectory, fallback: int) -> tuple[int, ...]:
    """Every version a trajectory's turns report ("3" or "3-4"); ``fallback`` when it has no turn."""
    out: list[int] = []
    for label in trajectory.weight_versions:
        if label:
            out += [int(x) for x in str(label).split("-")]
    return tuple(out) or (fallback,)


class _Prompts:
    """The scheduler's :class:`~sao.rl.rollout.PromptSource` over the run's task stream: group id =
    the prompt's index in the stream, so a request and its retries map back to one task.

    ``open``: the groups admitted and not yet closed. A group closes when the learner takes a
    trajectory of it (groups are trained whole) or when it is recorded failed. ``replay``: open
    groups of a checkpoint, admitted again (first) by a resumed run.
    """

    def __init__(self, tasks: Any):
        self.tasks = tasks
        self.refs: dict[int, PromptRef] = {}  # open groups, in admission order
        self.replay: deque[PromptRef] = deque()

    def next_group(self, size: int) -> tuple[Prompt, ...]:
        ref = self.replay.popleft() if self.replay else self.tasks.take(1)[0]
        self.refs[ref.index] = ref
        family = getattr(ref, "family", None) or "default"
        return tuple(Prompt(ref.index, i, family) for i in range(size))

    def close(self, group_id: int) -> None:
        self.refs.pop(group_id, None)

    def open(self) -> list[PromptRef]:
        """Open groups, then those still waiting to be replayed (a checkpoint's pending prompts)."""
        return [*self.refs.values(), *self.replay]


def _ref_to_dict(ref: PromptRef) -> dict[str, Any]:
    return asdict(ref)  # type: ignore[call-overload]


def _ref_from_dict(data: dict[str, Any]) -> PromptRef:
    if "phase" in data:  # a ScheduledPrompt (online-learning schedules)
        from sao.rl.schedule import ScheduledPrompt

        return ScheduledPrompt(**data)  # type: ignore[return-value]
    return PromptRef(**data)


RunEpisode = Callable[[Any, PromptRef, int, int], Awaitable[Trajectory]]  # (client, prompt, sample, seed)


class OrchestratedRollout:
    """A rollout source that runs ``mode``'s scheduler over ``replicas`` (module doc)."""

    def __init__(
        self,
        mode: str,
        config: SchedulerConfig,
        replicas: list[Replica],
        *,
        tasks: Any,
        run_episode: RunEpisode,
        weights_root: Path,
        seed: int,
        on_trajectory: Callable[[Trajectory], None] = lambda t: None,
        reload_timeout_s: float | None = 300.0,
        health: HealthConfig = HealthConfig(),
        on_restart: Callable[[int], None] = lambda rid: None,
    ):
        self.mode, self.config, self.replicas = mode, config, replicas
        self.tasks, self.run_episode, self.seed = tasks, run_episode, seed
        self.weights_root, self.reload_timeout_s = Path(weights_root), reload_timeout_s
        self.on_trajectory, self.health, self.on_restart = on_trajectory, health, on_restart
        self._prompts = _Prompts(tasks)
        self.start_version = 0
        self.scheduler = make_scheduler(mode, config, len(replicas), self._prompts)
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        self._batches: asyncio.Queue[tuple[RolloutBatch, bool]] = asyncio.Queue()  # (part, ends the step)
        self._step_trajectories: list[Trajectory] = []  # parts already released for the step being assembled
        self._finished: dict[int, Trajectory] = {}
        self._running: dict[int, tuple[StartTrajectory, asyncio.Task[Any]]] = {}  # no TrajectoryFinished sent yet
        self._failed: list[Trajectory] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._loaded: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._dead: set[int] = set()
        self._strikes = [0] * len(replicas)
        self._generation = [0] * len(replicas)  # bumped at each death: late answers of a past life are ignored
        self.deaths = [0] * len(replicas)
        self.restarts = [0] * len(replicas)
        self._t0 = time.monotonic()
        self._since_batch = time.monotonic()

    # ---- the RolloutSource seam ------------------------------------------------------------------

    async def next_batch(self, n: int, learner_version: int) -> RolloutBatch:
        """The next optimizer step's trajectories, all parts together."""
        return RolloutBatch.join([part async for part in self.next_parts(n, learner_version)])

    async def next_parts(self, n: int, learner_version: int) -> AsyncIterator[RolloutBatch]:
        """The next optimizer step's trajectories as the scheduler releases them: one part per
        ``TrainOn`` (``pipe``: complete groups, FIFO, while the rest of the batch is still being
        generated; the other modes release the batch in one part). The last part carries the step's
        rollout metrics. A learner that accumulates gradients part by part overlaps training with
        the rollout's tail (RolloutPipe's CGP)."""
        if n != self.config.batch_size:
            raise ValueError(f"asked for {n} trajectories, the scheduler was built for {self.config.batch_size}")
        self._ensure_running()
        assert self._loop_task is not None
        final = False
        while not final:
            getter = asyncio.ensure_future(self._batches.get())
            done, _ = await asyncio.wait({getter, self._loop_task}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                raise RuntimeError(f"the rollout loop stopped: {self._error!r}") from self._error
            part, final = getter.result()
            for t in (*part.trajectories, *part.failed):  # the learner has them: their groups are closed
                self._prompts.close(t.info["prompt_index"])
            yield part

    @property
    def streams_parts(self) -> bool:
        """Whether a step's batch comes in several parts worth training as they arrive."""
        return self.mode == "pipe"

    async def warmup_batch(self, n: int, learner_version: int) -> RolloutBatch:
        """``n`` episodes on the initial weights outside the schedule, before it starts (critic
        pretraining: no policy step follows, so the scheduler's step count must not move)."""
        if self._loop_task is not None:
            raise RuntimeError("warm-up batches come before the first scheduled batch")
        await self._load_start_version()
        group = self.config.group_size
        refs = self.tasks.take(n // group)
        jobs = [(ref, i) for ref in refs for i in range(group)]
        t0 = time.monotonic()

        async def one(k: int, ref: PromptRef, sample: int) -> Trajectory:
            replica = self.replicas[k % len(self.replicas)]
            t = await self.run_episode(_VersionedClient(replica), ref, sample, episode_seed(self.seed, ref.index, sample))
            t = replace(t, info={**t.info, "prompt_index": ref.index, "policy_version": learner_version, "warmup": True})
            self.on_trajectory(t)
            return t

        done = await asyncio.gather(*(one(k, ref, i) for k, (ref, i) in enumerate(jobs)))
        ok = tuple(t for t in done if failure(t) is None)
        return RolloutBatch(ok, tuple(t for t in done if failure(t) is not None), tuple(refs),
                            rollout_metrics(done, ok, time.monotonic() - t0))

    def on_weights(self, version: int) -> None:
        """The learner published ``version`` (its checkpoint is on disk): tell the scheduler. The
        first call sets the version the schedule starts at (k when the run resumed at step k)."""
        if self._loop_task is None:
            if self._loaded is not None:
                raise RuntimeError(f"version {version} published before the first scheduled batch but after "
                                   f"the replicas loaded version {self.start_version}")
            self.start_version = version
            self.scheduler = make_scheduler(self.mode, self.config, len(self.replicas), self._prompts, version)
            return
        self._events.put_nowait(TrainStepDone(version))

    def stats(self) -> dict[str, float]:
        s = self.scheduler.stats()
        live = [r.version for i, r in enumerate(self.replicas) if i not in self._dead] or [UNKNOWN_VERSION]
        return {
            "rollout/staleness_max": s.get("staleness/max", 0.0),
            "rollout/staleness_mean": s.get("staleness/mean", 0.0),
            "rollout/lost": float(self.lost()),
            "rollout/requeued": s.get("ledger/requeued", 0.0),
            "rollout/admitted": s.get("ledger/admitted", 0.0),
            "rollout/trained": s.get("ledger/trained", 0.0),
            "rollout/failed_total": s.get("ledger/failed", 0.0),
            "rollout/in_flight": s.get("rollout/in_flight", 0.0),
            "rollout/replica_deaths": float(sum(self.deaths)),
            "rollout/replica_restarts": float(sum(self.restarts)),
            "rollout/replicas_live": float(len(self.replicas) - len(self._dead)),
            "engine/weight_version": float(max(live)),
            "engine/weight_version_min": float(min(live)),
        }

    def lost(self) -> int:
        """Admitted attempts in no bucket: admitted - (in flight + waiting + trained + requeued + failed)."""
        c = self.scheduler.stats()
        ended = sum(c.get(f"ledger/{k}", 0.0) for k in ("in_flight", "waiting", "trained", "requeued", "failed"))
        return int(c.get("ledger/admitted", 0.0) - ended)

    def state_dict(self) -> dict[str, Any]:
        """The task cursor and the prompts admitted but not yet taken by the learner (module doc)."""
        return {"tasks": self.tasks.state_dict(), "open": [_ref_to_dict(r) for r in self._prompts.open()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._loop_task is not None:
            raise RuntimeError("load_state_dict comes before the first batch")
        self.tasks.load_state_dict(state["tasks"])
        self._prompts.refs.clear()
        self._prompts.replay = deque(_ref_from_dict(d) for d in state.get("open", []))
        if self._prompts.replay:
            log.info("re-admitting %d prompt(s) that were in flight or untrained at the checkpoint",
                     len(self._prompts.replay))

    async def aclose(self) -> None:
        tasks = [*self._tasks, *([self._loop_task] if self._loop_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- the event loop --------------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            await self._load_start_version()
            self._spawn(self._watch())
            self._execute(self.scheduler.start(self._now()))
            while True:
                event = await self._events.get()
                if isinstance(event, BaseException):  # a helper task failed for good
                    raise event
                self._execute(self.scheduler.on_event(event, self._now()))
                self.scheduler.check()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced by next_batch
            self._error = exc
            log.exception("rollout loop failed")
            raise

    async def _load_start_version(self) -> None:
        """Every replica loads the learner's start version before it serves (once)."""
        if self._loaded is None:
            self._loaded = asyncio.ensure_future(asyncio.gather(
                *(self._load(r, self.start_version) for r in self.replicas)))
        await asyncio.shield(self._loaded)

    async def _load(self, replica: Replica, version: int) -> None:
        folder = version_dir(self.weights_root, version)
        await replica.control.pause(mode="keep")
        try:
            await replica.control.reload_weights(folder.resolve(), timeout_s=self.reload_timeout_s)
            await replica.control.set_weight_version(version)
            await replica.control.reset_prefix_cache()
            replica.version = version
        finally:
            await replica.control.resume()

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _execute(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, (StartTrajectory, SyncReplica)) and action.replica in self._dead:
                # Decided before the scheduler read the queued ReplicaDied, which ends this attempt
                # (re-queued) or this sync: nothing to run.
                log.debug("skipping %r: replica %d is dead", action, action.replica)
            elif isinstance(action, StartTrajectory):
                self._running[action.traj_id] = (action, self._spawn(self._episode(action)))
            elif isinstance(action, SyncReplica):
                self._spawn(self._sync(action))
            elif isinstance(action, TrainOn):
                self._train_on(action)
            elif isinstance(action, Discard):
                self._finished.pop(action.traj_id, None)
            elif isinstance(action, (Requeue, RecordFailed)):
                t = self._finished.pop(action.traj_id, None)
                if isinstance(action, RecordFailed):
                    self._prompts.close(action.prompt.group_id)
                    if t is not None:
                        self._failed.append(t)
                log.info("trajectory %d %s: %s", action.traj_id,
                         "re-queued" if isinstance(action, Requeue) else "failed", action.cause)
            else:
                raise TypeError(f"unknown action {action!r}")

    async def _episode(self, start: StartTrajectory) -> None:
        replica = self.replicas[start.replica]
        ref = self._prompts.refs[start.prompt.group_id]
        seed = episode_seed(self.seed, ref.index, start.prompt.index + 1000 * start.prompt.attempt)
        trajectory: Trajectory | None
        try:
            trajectory = await self.run_episode(_VersionedClient(replica), ref, start.prompt.index, seed)
        except Exception as exc:  # noqa: BLE001 - an episode that raises is a failed attempt, not a dead loop
            log.warning("trajectory %d raised %r; recorded as a failed attempt", start.traj_id, exc)
            trajectory, cause = None, f"episode raised {type(exc).__name__}: {exc}"
        if trajectory is None or trajectory.status != "ok":
            # A crashed engine fails every request on it: see it before the failures count against prompts.
            await self._check(start.replica, at_once=True)
        if start.traj_id not in self._running:
            return  # its replica died meanwhile; the scheduler re-queued or failed the attempt
        del self._running[start.traj_id]
        if trajectory is None:
            self._events.put_nowait(TrajectoryFinished(start.traj_id, (start.version,), 0, True, cause))
            return
        versions = turn_versions(trajectory, start.version)
        trajectory = replace(trajectory, info={**trajectory.info, "traj_id": start.traj_id, "replica": start.replica,
                                               "attempt": start.prompt.attempt, "prompt_index": ref.index,
                                               "policy_version": min(versions)})
        self.on_trajectory(trajectory)
        self._finished[start.traj_id] = trajectory
        cause = failure(trajectory)
        self._events.put_nowait(TrajectoryFinished(start.traj_id, versions, trajectory.num_action_tokens,
                                                   cause is not None, cause or ""))

    async def _sync(self, action: SyncReplica) -> None:
        rid, replica = action.replica, self.replicas[action.replica]
        generation = self._generation[rid]
        try:
            await self._load(replica, action.version)
        except Exception as exc:  # noqa: BLE001 - a replica that cannot load weights is treated as dead
            if rid not in self._dead and generation == self._generation[rid]:
                log.warning("replica %d failed to load version %d: %r", rid, action.version, exc)
                self._declare_dead(rid, f"weight reload failed: {exc}")
            return
        if rid not in self._dead and generation == self._generation[rid]:
            self._events.put_nowait(SyncDone(rid, action.version))

    def _train_on(self, action: TrainOn) -> None:
        trajectories = tuple(self._finished.pop(t) for t in action.traj_ids)
        self._step_trajectories += trajectories
        metrics: dict[str, float] = {}
        if action.final:
            step, self._step_trajectories = self._step_trajectories, []
            staleness = [action.step - t.info["policy_version"] for t in step]
            wall, self._since_batch = time.monotonic() - self._since_batch, time.monotonic()
            metrics = {**rollout_metrics(step, step, wall), **self.stats(),
                       "rollout/batch_staleness_max": float(max(staleness)),
                       "rollout/batch_staleness_mean": sum(staleness) / len(staleness)}
        failed, self._failed = tuple(self._failed), []
        self._batches.put_nowait((RolloutBatch(trajectories, failed, (), metrics), action.final))

    # ---- health ----------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Check every live replica each ``health.interval_s`` (module doc)."""
        while True:
            await asyncio.sleep(self.health.interval_s)
            await asyncio.gather(*(self._check(rid) for rid in range(len(self.replicas)) if rid not in self._dead))

    async def _healthy(self, replica: Replica) -> bool:
        if replica.alive is not None and not replica.alive():
            return False
        try:
            return bool(await asyncio.wait_for(replica.control.health(), self.health.timeout_s))
        except Exception:  # noqa: BLE001 - no answer is an unhealthy answer
            return False

    async def _check(self, rid: int, *, at_once: bool = False, cause: str | None = None) -> None:
        """Declare ``rid`` dead if it is: its process exited, or ``/health`` failed ``failures`` times
        in a row (``at_once``: one failed check is enough -- a failed episode or reload just hit it)."""
        if rid in self._dead:
            return
        replica = self.replicas[rid]
        if await self._healthy(replica):
            self._strikes[rid] = 0
            return
        self._strikes[rid] += 1
        exited = replica.alive is not None and not replica.alive()
        if rid in self._dead or not (at_once or exited or self._strikes[rid] >= self.health.failures):
            return
        self._declare_dead(rid, cause or ("engine process exited" if exited else
                                          f"/health failed {self._strikes[rid]} time(s) in a row"))

    def _declare_dead(self, rid: int, cause: str) -> None:
        self._dead.add(rid)
        self._generation[rid] += 1
        self.deaths[rid] += 1
        self._strikes[rid] = 0
        self.replicas[rid].version = UNKNOWN_VERSION
        orphans = [tid for tid, (start, _) in self._running.items() if start.replica == rid]
        log.warning("replica %d died (%s); %d trajectories in flight on it are re-queued or recorded failed",
                    rid, cause, len(orphans))
        self._events.put_nowait(ReplicaDied(rid, cause))  # before any late TrajectoryFinished of them
        for tid in orphans:
            _, task = self._running.pop(tid)
            task.cancel()
        self._spawn(self._revive(rid))

    async def _revive(self, rid: int) -> None:
        """Restart a managed replica (or wait for an external one to answer again), then tell the scheduler."""
        replica = self.replicas[rid]
        while True:
            if replica.restart is None:
                await asyncio.sleep(self.health.interval_s)
                if not await self._healthy(replica):
                    continue
            else:
                if self.restarts[rid] >= self.health.max_restarts:
                    self._events.put_nowait(RuntimeError(
                        f"replica {rid} died {self.deaths[rid]} time(s); engine.max_restarts="
                        f"{self.health.max_restarts} restarts used up"))
                    return
                self.restarts[rid] += 1
                log.warning("restarting replica %d (restart %d of at most %d)", rid, self.restarts[rid],
                            self.health.max_restarts)
                try:
                    await replica.restart()
                except Exception as exc:  # noqa: BLE001 - counted; tried again up to max_restarts
                    log.warning("restarting replica %d failed: %r", rid, exc)
                    continue
                self.on_restart(rid)
            break
        self._dead.discard(rid)
        log.info("replica %d is back; it loads the newest weights before it serves", rid)
        self._events.put_nowait(ReplicaRestarted(rid))
