"""Episodes the rollout driver plays outside its schedule, on the same replicas.

- **Warm-up batches** (critic pretraining, before the schedule starts): ``group`` episodes per prompt on
  the start version, spread over the replicas, at most ``slots`` at once. An episode that a replica's
  death cut is recorded as a failed attempt and played again once the replica is back and serves the
  start version again; an episode that fails on a live replica is returned as failed, as in a batch.
- **Forgetting probes** (:meth:`OffSchedule.probes`): one episode per prompt on the live replica that
  serves the newest version, recorded with ``rollout.probe = True`` and never trained on. Each probe's
  ``policy_version`` is the oldest version its turns ran on.

Neither moves the scheduler: no step count, no ledger entry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from sao.agents import RolloutMeta, Trajectory
from sao.agents.loop import episode_seed
from sao.rl.learner import failure
from sao.rl.prompts import PromptRef
from sao.rl.rollout.driver_loop import RunEpisode
from sao.rl.rollout.replica_health import Replica, ReplicaHealth
from sao.rl.rollout.served import ServedVersions
from sao.rl.rollout.sources import RolloutBatch, rollout_metrics
from sao.rl.rollout.versioned_client import VersionedClient, turn_versions

log = logging.getLogger(__name__)


class OffSchedule:
    """Warm-up batches and forgetting probes on ``replicas`` (module doc), which serve ``versions``.
    ``load(rid, version)`` gives a replica a version (the driver's load); ``on_trajectory`` records each
    episode as it ends."""

    def __init__(self, replicas: list[Replica], versions: ServedVersions, health: ReplicaHealth,
                 run_episode: RunEpisode, *, seed: int, on_trajectory: Callable[[Trajectory], None],
                 load: Callable[[int, int], Awaitable[None]], slots: int):
        self.replicas, self.versions, self.health = replicas, versions, health
        self.run_episode, self.seed = run_episode, seed
        self.on_trajectory, self.load = on_trajectory, load
        self._slots = asyncio.Semaphore(slots)
        self._reloads: dict[tuple[int, int], asyncio.Future[None]] = {}  # (replica, generation) -> its reload

    async def warmup(self, refs: list[PromptRef], group: int, version: int) -> RolloutBatch:
        t0 = time.monotonic()
        jobs = [(ref, i) for ref in refs for i in range(group)]
        done = await asyncio.gather(*(self._warm(k % len(self.replicas), ref, i, version)
                                      for k, (ref, i) in enumerate(jobs)))
        ok = tuple(t for t in done if failure(t) is None)
        return RolloutBatch(ok, tuple(t for t in done if failure(t) is not None), tuple(refs),
                            rollout_metrics(done, ok, time.monotonic() - t0))

    async def _warm(self, rid: int, ref: PromptRef, sample: int, version: int) -> Trajectory:
        attempt = 0
        while True:
            generation = self.health.generation(rid)
            async with self._slots:
                t = await self.run_episode(self._client(rid), ref, sample, episode_seed(self.seed, ref.index, sample))
            t = replace(t, rollout=RolloutMeta(ref.index, version, replica=rid, attempt=attempt, warmup=True))
            self.on_trajectory(t)
            # one check at once, as the driver makes for a failed scheduled episode
            if failure(t) is None or not await self.health.died_since(rid, generation, grace_s=0.0):
                return t
            log.warning("a warm-up episode of prompt %d was cut by replica %d's death; it runs again once the "
                        "replica is back", ref.index, rid)
            await self.health.back(rid)
            key = (rid, self.health.generation(rid))
            if key not in self._reloads:  # the episodes it cut wait on one reload
                self._reloads[key] = asyncio.ensure_future(self.load(rid, version))
            await asyncio.shield(self._reloads[key])
            attempt += 1

    async def probes(self, prompts: list[PromptRef]) -> list[Trajectory]:
        live = [k for k in range(len(self.replicas)) if k not in self.health.dead]
        if not live:
            raise RuntimeError("no live replica to run the forgetting probes on")
        k = max(live, key=lambda i: self.versions[i])

        async def one(ref: PromptRef) -> Trajectory:
            start = self.versions[k]
            t = await self.run_episode(self._client(k), ref, 0, episode_seed(self.seed, ref.index, 0))
            t = replace(t, rollout=RolloutMeta(ref.index, min(turn_versions(t, start)), replica=k, probe=True))
            self.on_trajectory(t)
            return t

        return list(await asyncio.gather(*(one(ref) for ref in prompts)))

    def _client(self, rid: int) -> VersionedClient:
        return VersionedClient(self.replicas[rid].client, lambda: self.versions[rid], lambda: self.versions.kv(rid))
