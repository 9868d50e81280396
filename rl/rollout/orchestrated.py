"""Rollout on real engines: a :mod:`sao.rl.rollout.schedulers` scheduler driven by asyncio, for every mode.

:class:`OrchestratedRollout` is the :class:`~sao.rl.rollout.sources.RolloutSource` (``next_batch``,
``on_weights``) of every rollout mode: ``sync``, ``one_step_off``, ``async``, ``multi_version`` and
``pipe``, each its scheduler over the replicas. It is the seam between the learner and the driver,
whose parts live by role:

- :mod:`sao.rl.rollout.driver_loop`: the event loop that executes the scheduler's actions (episodes as
  tasks, per-replica weight reloads, the learner's batch parts);
- :mod:`sao.rl.rollout.replica_health`: :class:`Replica`, :class:`HealthConfig` and the replicas' watches
  (:class:`~sao.agents.engine.watch.EngineWatch`), which turn a crashed or hung replica into
  ``ReplicaDied``, restart it and report ``ReplicaRestarted``;
- :mod:`sao.rl.rollout.served`: what each replica serves, the one record of its version and of its KV
  cache; :mod:`sao.rl.rollout.prefix_resets`: a refused prefix-cache reset, warned about and retried;
- :mod:`sao.rl.rollout.versioned_client`: the version of every turn (the oldest counts for staleness);
- :mod:`sao.rl.prompts.open_prompts`: the prompts admitted but not yet trained.

The learner publishes a version by writing its checkpoint (:class:`~sao.rl.weights.sync.WeightPublisher`)
and calling :meth:`on_weights`; the scheduler decides when each replica loads it. ``rollout=sync``
differs in two ways: the learner loads each version into its one engine itself and probes it
(:mod:`sao.rl.weights.replica_sync`), reporting ``Served(replica, version, pushed=True)`` to this source
(:meth:`OrchestratedRollout.apply`), so the driver's load finds it served and has nothing to do; and its
scheduler hears of the version when the learner asks for the next batch, so nothing is sampled
between a batch and the next request for one.

Start and resume: every replica first loads the learner's version (``weights/v{k}``) -- a resumed
run starts its scheduler at version k. :meth:`state_dict` holds the task cursor and the prompts
admitted but not yet handed to the learner (in flight, finished-untrained, re-queued, or in a batch
not yet taken); a resumed source admits those first, so none is lost and none is trained twice. It
also holds the run's counts (attempts admitted, trained, re-queued, failed) and the lengths so far,
so that a resumed run's figures go on from them instead of starting again from zero.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sao.agents import Trajectory
from sao.rl.prompts import OpenPrompts, PromptRef, ref_from_dict, ref_to_dict
from sao.rl.rollout.driver_loop import DriverLoop, RunEpisode
from sao.rl.rollout.off_schedule import OffSchedule
from sao.rl.rollout.prefix_resets import PrefixResets
from sao.rl.rollout.replica_health import HealthConfig, Replica, ReplicaControl
from sao.rl.rollout.schedulers import (
    UNKNOWN_VERSION, ClosedCounts, Scheduler, SchedulerConfig, TrainStepDone, make_scheduler,
)
from sao.rl.rollout.served import ServedVersions
from sao.rl.rollout.sources import RolloutBatch, rollout_meta
from sao.rl.rollout.versioned_client import turn_versions
from sao.rl.weights import Served, load_weights, version_dir

__all__ = ["HealthConfig", "OrchestratedRollout", "Replica", "ReplicaControl", "RunEpisode", "turn_versions"]

log = logging.getLogger(__name__)


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
        keep_kv: bool = False,
    ):
        self.mode, self.config, self.replicas = mode, config, replicas
        self.tasks, self.run_episode, self.seed = tasks, run_episode, seed
        self.weights_root, self.reload_timeout_s = Path(weights_root), reload_timeout_s
        self.on_trajectory = on_trajectory
        self.keep_kv = keep_kv  # a load keeps the in-flight requests' KV blocks (sao.rl.weights.load)
        self._prompts = OpenPrompts(tasks)
        self.start_version = 0
        self._versions = ServedVersions(len(replicas))
        self._driver = DriverLoop(make_scheduler(mode, config, len(replicas), self._prompts), replicas, self._versions,
                                  self._prompts,
                                  run_episode=run_episode, load=self._load, seed=seed,
                                  on_trajectory=lambda t: self.on_trajectory(t),  # the trainer may set it later
                                  health=health, on_restart=on_restart,
                                  # a batch's worth of requests, each failed as often as it may, and none ok
                                  failing_after=config.batch_size * config.max_failures)
        self._resets = PrefixResets(replicas, self._versions, self._driver.health, self._driver.spawn, keep_kv=keep_kv)
        self._loop_task: asyncio.Task[None] | None = None
        self._loaded: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._published: int | None = None  # rollout=sync: a version published, not yet told the scheduler
        self._off = OffSchedule(replicas, self._versions, self._driver.health, run_episode, seed=seed, load=self._load,
                                on_trajectory=lambda t: self.on_trajectory(t),
                                slots=config.max_concurrency * len(replicas))

    @property
    def scheduler(self) -> Scheduler:
        return self._driver.scheduler

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
        if self._published is not None:  # rollout=sync: the step the learner finished (on_weights)
            self._driver.events.put_nowait(TrainStepDone(self._published))
            self._published = None
        final = False
        while not final:
            getter = asyncio.ensure_future(self._driver.batches.get())
            done, _ = await asyncio.wait({getter, self._loop_task}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                raise RuntimeError(f"the rollout loop stopped: {self._error!r}") from self._error
            part, final = getter.result()
            for t in (*part.trajectories, *part.failed):  # the learner has them: their groups are closed
                self._prompts.close(rollout_meta(t).prompt_index)
            yield part

    @property
    def streams_parts(self) -> bool:
        """Whether a step's batch comes in several parts worth training as they arrive."""
        return self.mode == "pipe"

    async def warmup_batch(self, n: int, learner_version: int) -> RolloutBatch:
        """``n`` episodes on the initial weights outside the schedule, before it starts (critic
        pretraining: no policy step follows, so the scheduler's step count must not move;
        :mod:`sao.rl.rollout.off_schedule`)."""
        if self._loop_task is not None:
            raise RuntimeError("warm-up batches come before the first scheduled batch")
        await self._load_start_version()
        return await self._off.warmup(self.tasks.take(n // self.config.group_size), self.config.group_size,
                                      learner_version)

    async def evaluate(self, prompts: list[PromptRef]) -> list[Trajectory]:
        """One episode per prompt outside the schedule, never trained on (forgetting probes), on the live
        replica that serves the newest version (:mod:`sao.rl.rollout.off_schedule`)."""
        await self._load_start_version()
        return await self._off.probes(prompts)

    def on_weights(self, version: int) -> None:
        """The learner published ``version`` (its checkpoint is on disk): tell the scheduler. The
        first call sets the version the schedule starts at (k when the run resumed at step k)."""
        if self._loop_task is None:
            if self._loaded is not None:
                raise RuntimeError(f"version {version} published before the first scheduled batch but after "
                                   f"the replicas loaded version {self.start_version}")
            self.start_version = version
            self._driver.reschedule(make_scheduler(self.mode, self.config, len(self.replicas), self._prompts, version))
            return
        if self.mode == "sync":  # its next batch starts when the learner asks for it (next_parts), as a
            self._published = version  # synchronous loop's does: nothing samples under its probes, evaluation
            return  # and checkpoint, or past its last step
        self._driver.events.put_nowait(TrainStepDone(version))

    def stats(self) -> dict[str, float]:
        return self._driver.stats()

    def lost(self) -> int:
        """Admitted attempts in no bucket: admitted - (in flight + waiting + trained + requeued + failed)."""
        return self._driver.lost()

    def state_dict(self) -> dict[str, Any]:
        """The task cursor and the prompts admitted but not yet taken by the learner (module doc)."""
        return {"tasks": self.tasks.state_dict(), "open": [ref_to_dict(r) for r in self._prompts.open()],
                "counts": self._driver.closed_counts().to_json(), "lengths": self._driver.lengths.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._loop_task is not None:
            raise RuntimeError("load_state_dict comes before the first batch")
        self.tasks.load_state_dict(state["tasks"])
        self._prompts.reopen([ref_from_dict(d) for d in state.get("open", [])])
        # the run's counts go on
        self._driver.carry(ClosedCounts.from_json(state.get("counts", {})), state.get("lengths", {}))
        if self._prompts.replay:
            log.info("re-admitting %d prompt(s) that were in flight or untrained at the checkpoint",
                     len(self._prompts.replay))

    async def aclose(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        await self._driver.tasks.aclose()
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)

    def _ensure_running(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            await self._load_start_version()
            await self._driver.run()
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
                *(self._load(rid, self.start_version) for rid in range(len(self.replicas)))))
        await asyncio.shield(self._loaded)

    # ------------------------------------------------------------ a push's target (sao.rl.weights.PushTarget)

    def generation(self, rid: int) -> int:
        """Replica ``rid``'s life: bumped at each of its deaths (:mod:`sao.rl.rollout.replica_health`)."""
        return self._driver.health.generation(rid)

    async def back_since(self, rid: int, generation: int) -> bool:
        """Whether replica ``rid`` died after ``generation`` was read (a call on it just failed) and, when
        it did, once it is back and has loaded the version the scheduler gave it (False: it lives, the
        failure was the caller's own)."""
        health = self._driver.health
        if self._loop_task is None or not await health.died_since(rid, generation):
            return False
        await health.back(rid)
        while self._versions[rid] == UNKNOWN_VERSION:
            if self._loop_task.done():
                raise RuntimeError(f"replica {rid} did not come back: {self._error!r}") from self._error
            await asyncio.sleep(0.05)
        return True

    def apply(self, event: Served) -> None:
        """The learner's weight sync reports what a replica serves now (``rollout=sync``'s push)."""
        self._versions.apply(event)

    async def _load(self, rid: int, version: int) -> None:
        """Replica ``rid`` serves ``version`` once this returns: loaded, unless a push made it serve it already."""
        if self._versions.pushed(rid, version):
            return  # the learner's WeightSync loaded it (sao.rl.weights.replica_sync)
        await load_weights(self.replicas[rid].control, version_dir(self.weights_root, version).resolve(), version,
                           mode="keep", timeout_s=self.reload_timeout_s, keep_kv=self.keep_kv,
                           before_resume=lambda reset: self._resets.resumed(rid, version, reset))

