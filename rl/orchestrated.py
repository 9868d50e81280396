"""Asynchronous rollout on real engines: a :mod:`sao.rl.rollout` scheduler driven by asyncio.

:class:`OrchestratedRollout` is a :class:`~sao.rl.sources.RolloutSource` (``next_batch``,
``on_weights``) for ``rollout=one_step_off|async|multi_version|pipe`` (and ``sync``). It feeds the
mode's clock-agnostic scheduler the events of real episodes and replicas, and executes its actions:

    StartTrajectory(traj, prompt, replica)  -> run one episode on that replica's client (a task)
                                               ... its end -> TrajectoryFinished(versions per turn)
    SyncReplica(replica, version)           -> pause (in-flight requests wait), reload
                                               weights/v{version}, label, reset prefix cache, resume
                                               ... -> SyncDone
    TrainOn(step, trajs, final)             -> hand the trajectories to the learner's next batch
    Discard / Requeue / RecordFailed        -> write the attempt down (nothing is lost)

One consumer task reads the event queue and calls the scheduler, so the scheduler needs no lock.
The learner publishes a version by writing its checkpoint (:class:`~sao.rl.sync.WeightPublisher`)
and calling :meth:`on_weights`; the scheduler decides when each replica loads it.

Versions: every turn records the replica's version when its request was sent and when it came
back (a sync can land mid-request: ``pause_mode="keep"`` lets the request continue on the new
weights). The oldest of them is the trajectory's version for staleness (METHOD.md 1.10).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from sao.agents import Completion, Trajectory
from sao.agents.client import CompletionClient, SamplingParams
from sao.rl.rollout import (
    Discard,
    Prompt,
    RecordFailed,
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
from sao.rl.sources import RolloutBatch, rollout_metrics
from sao.rl.sync import version_dir
from sao.rl.tasks import PromptRef, episode_seed

log = logging.getLogger(__name__)


class ReplicaControl(Protocol):
    """The control endpoints of one engine replica (``EngineClient`` on vLLM)."""

    async def pause(self, *, mode: str = "abort") -> None: ...

    async def resume(self) -> None: ...

    async def reload_weights(self, path: str | Path, *, timeout_s: float | None = None) -> None: ...

    async def set_weight_version(self, version: int | str) -> None: ...

    async def reset_prefix_cache(self) -> bool: ...


@dataclass
class Replica:
    """One engine replica: where completions go, how it is controlled, and what it serves now."""

    client: CompletionClient
    control: ReplicaControl
    version: int = 0


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
    the prompt's index in the stream, so a request and its retries map back to one task."""

    def __init__(self, tasks: Any):
        self.tasks = tasks
        self.refs: dict[int, PromptRef] = {}

    def next_group(self, size: int) -> tuple[Prompt, ...]:
        ref = self.tasks.take(1)[0]
        self.refs[ref.index] = ref
        family = getattr(ref, "family", None) or "default"
        return tuple(Prompt(ref.index, i, family) for i in range(size))


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
    ):
        self.mode, self.config, self.replicas = mode, config, replicas
        self.tasks, self.run_episode, self.seed = tasks, run_episode, seed
        self.weights_root, self.reload_timeout_s = Path(weights_root), reload_timeout_s
        self.on_trajectory = on_trajectory
        self._prompts = _Prompts(tasks)
        self.scheduler = make_scheduler(mode, config, len(replicas), self._prompts)
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        self._batches: asyncio.Queue[RolloutBatch] = asyncio.Queue()
        self._finished: dict[int, Trajectory] = {}
        self._started: dict[int, StartTrajectory] = {}
        self._pending: list[int] = []  # trajectories of the optimizer step being assembled
        self._failed: list[Trajectory] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._t0 = time.monotonic()
        self._since_batch = time.monotonic()

    # ---- the RolloutSource seam ------------------------------------------------------------------

    async def next_batch(self, n: int, learner_version: int) -> RolloutBatch:
        if n != self.config.batch_size:
            raise ValueError(f"asked for {n} trajectories, the scheduler was built for {self.config.batch_size}")
        self._ensure_running()
        getter = asyncio.ensure_future(self._batches.get())
        done, _ = await asyncio.wait({getter, self._loop_task}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            raise RuntimeError(f"the rollout loop stopped: {self._error!r}") from self._error
        return getter.result()

    async def warmup_batch(self, n: int, learner_version: int) -> RolloutBatch:
        """``n`` episodes on the initial weights outside the schedule, before it starts (critic
        pretraining: no policy step follows, so the scheduler's step count must not move)."""
        if self._loop_task is not None:
            raise RuntimeError("warm-up batches come before the first scheduled batch")
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
        ok = tuple(t for t in done if t.status == "ok")
        return RolloutBatch(ok, tuple(t for t in done if t.status != "ok"), tuple(refs),
                            rollout_metrics(done, ok, time.monotonic() - t0))

    def on_weights(self, version: int) -> None:
        """The learner published ``version`` (its checkpoint is on disk): tell the scheduler."""
        if self._loop_task is None:
            if version != 0:
                raise NotImplementedError(
                    f"resuming an asynchronous run (at version {version}) is not supported yet: the scheduler "
                    "starts at version 0. Resume with rollout=sync, or start a new run")
            return  # replicas start on the initial weights (version 0)
        self._events.put_nowait(TrainStepDone(version))

    def stats(self) -> dict[str, float]:
        s = self.scheduler.stats()
        return {
            "rollout/staleness_max": s.get("staleness/max", 0.0),
            "rollout/staleness_mean": s.get("staleness/mean", 0.0),
            "rollout/lost": float(self.lost()),
            "rollout/requeued": s.get("ledger/requeued", 0.0),
            "rollout/admitted": s.get("ledger/admitted", 0.0),
            "rollout/trained": s.get("ledger/trained", 0.0),
            "rollout/failed_total": s.get("ledger/failed", 0.0),
            "rollout/in_flight": s.get("rollout/in_flight", 0.0),
            "engine/weight_version": float(max(r.version for r in self.replicas)),
            "engine/weight_version_min": float(min(r.version for r in self.replicas)),
        }

    def lost(self) -> int:
        """Admitted attempts in no bucket: admitted - (in flight + waiting + trained + requeued + failed)."""
        c = self.scheduler.stats()
        ended = sum(c.get(f"ledger/{k}", 0.0) for k in ("in_flight", "waiting", "trained", "requeued", "failed"))
        return int(c.get("ledger/admitted", 0.0) - ended)

    def state_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks.load_state_dict(state["tasks"])

    async def aclose(self) -> None:
        for task in [*self._tasks, *( [self._loop_task] if self._loop_task else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, *([self._loop_task] if self._loop_task else []), return_exceptions=True)

    # ---- the event loop --------------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            self._execute(self.scheduler.start(self._now()))
            while True:
                event = await self._events.get()
                self._execute(self.scheduler.on_event(event, self._now()))
                self.scheduler.check()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced by next_batch
            self._error = exc
            log.exception("rollout loop failed")
            raise

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _execute(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, StartTrajectory):
                self._started[action.traj_id] = action
                self._spawn(self._episode(action))
            elif isinstance(action, SyncReplica):
                self._spawn(self._sync(action))
            elif isinstance(action, TrainOn):
                self._train_on(action)
            elif isinstance(action, Discard):
                self._finished.pop(action.traj_id, None)
            elif isinstance(action, (Requeue, RecordFailed)):
                t = self._finished.pop(action.traj_id, None)
                if isinstance(action, RecordFailed) and t is not None:
                    self._failed.append(t)
                log.info("trajectory %d %s: %s", action.traj_id,
                         "re-queued" if isinstance(action, Requeue) else "failed", action.cause)
            else:
                raise TypeError(f"unknown action {action!r}")

    async def _episode(self, start: StartTrajectory) -> None:
        replica = self.replicas[start.replica]
        ref = self._prompts.refs[start.prompt.group_id]
        seed = episode_seed(self.seed, ref.index, start.prompt.index + 1000 * start.prompt.attempt)
        trajectory = await self.run_episode(_VersionedClient(replica), ref, start.prompt.index, seed)
        versions = turn_versions(trajectory, start.version)
        trajectory = replace(trajectory, info={**trajectory.info, "traj_id": start.traj_id, "replica": start.replica,
                                               "attempt": start.prompt.attempt, "prompt_index": ref.index,
                                               "policy_version": min(versions)})
        self.on_trajectory(trajectory)
        self._finished[start.traj_id] = trajectory
        failed = trajectory.status != "ok"
        self._events.put_nowait(TrajectoryFinished(start.traj_id, versions, trajectory.num_action_tokens, failed,
                                                   trajectory.error or ""))

    async def _sync(self, action: SyncReplica) -> None:
        replica = self.replicas[action.replica]
        folder = version_dir(self.weights_root, action.version)
        await replica.control.pause(mode="keep")
        try:
            await replica.control.reload_weights(folder.resolve(), timeout_s=self.reload_timeout_s)
            await replica.control.set_weight_version(action.version)
            await replica.control.reset_prefix_cache()
            replica.version = action.version
        finally:
            await replica.control.resume()
        self._events.put_nowait(SyncDone(action.replica, action.version))

    def _train_on(self, action: TrainOn) -> None:
        self._pending += list(action.traj_ids)
        if not action.final:
            return
        trajectories = tuple(self._finished.pop(t) for t in self._pending)
        self._pending = []
        staleness = [action.step - t.info["policy_version"] for t in trajectories]
        wall, self._since_batch = time.monotonic() - self._since_batch, time.monotonic()
        metrics = {**rollout_metrics(trajectories, trajectories, wall), **self.stats(),
                   "rollout/batch_staleness_max": float(max(staleness)),
                   "rollout/batch_staleness_mean": sum(staleness) / len(staleness)}
        failed, self._failed = tuple(self._failed), []
        self._batches.put_nowait(RolloutBatch(trajectories, failed, (), metrics))
