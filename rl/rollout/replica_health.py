"""Replica health for the rollout driver: what a replica is, when it is dead, and bringing it back.

A :class:`ReplicaWatcher` checks every replica each ``health.interval_s``; one whose process exited
(``Replica.alive``) or whose ``/health`` failed ``health.failures`` times in a row is dead. The
driver also asks for a check at once when an episode fails, so a crash is seen before its failed
attempts count against their prompts. A dead replica -> :class:`~sao.rl.rollout.schedulers.ReplicaDied` (the
scheduler re-queues or fails its in-flight attempts; the driver cancels their tasks), then
``Replica.restart`` (a managed vLLM starts again on its port) or, for an external engine, waiting
for ``/health`` -> :class:`~sao.rl.rollout.schedulers.ReplicaRestarted` (the scheduler syncs it to the newest
version before it serves). Each death bumps the replica's *generation*: a late answer of a past life
(a reload that finishes after the death) is ignored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sao.agents.clients import CompletionClient
from sao.rl.rollout.schedulers import UNKNOWN_VERSION, ReplicaDied, ReplicaRestarted
from sao.rl.weights import WeightControl

log = logging.getLogger(__name__)


class ReplicaControl(WeightControl, Protocol):
    """The control endpoints of one engine replica (``EngineClient`` on vLLM): a weight load's, and health."""

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


class ReplicaWatcher:
    """Declares replicas dead and brings them back (module doc).

    ``report``: where its events go (the driver's event queue): ``ReplicaDied``, ``ReplicaRestarted``,
    or an exception when a replica's restarts are used up. ``orphan(rid)``: cancel the episodes in
    flight on a dead replica, returning how many. ``spawn``: run a helper task the driver owns.
    """

    def __init__(self, replicas: list[Replica], config: HealthConfig, *, report: Callable[[Any], None],
                 orphan: Callable[[int], int], spawn: Callable[[Awaitable[Any]], Any],
                 on_restart: Callable[[int], None] = lambda rid: None):
        self.replicas, self.config = replicas, config
        self.report, self.orphan, self.spawn, self.on_restart = report, orphan, spawn, on_restart
        self.dead: set[int] = set()
        self._strikes = [0] * len(replicas)
        self.generation = [0] * len(replicas)  # bumped at each death: late answers of a past life are ignored
        self.deaths = [0] * len(replicas)
        self.restarts = [0] * len(replicas)
        self.given_up: dict[int, str] = {}  # replicas whose restarts are used up: why

    def current(self, rid: int, generation: int) -> bool:
        """Whether ``rid`` is live and still in the life ``generation`` was read in."""
        return rid not in self.dead and generation == self.generation[rid]

    async def watch(self) -> None:
        """Check every live replica each ``interval_s``."""
        while True:
            await asyncio.sleep(self.config.interval_s)
            await asyncio.gather(*(self.check(rid) for rid in range(len(self.replicas)) if rid not in self.dead))

    async def healthy(self, replica: Replica) -> bool:
        if replica.alive is not None and not replica.alive():
            return False
        try:
            return bool(await asyncio.wait_for(replica.control.health(), self.config.timeout_s))
        except Exception:  # noqa: BLE001 - no answer is an unhealthy answer
            return False

    async def check(self, rid: int, *, at_once: bool = False, cause: str | None = None) -> None:
        """Declare ``rid`` dead if it is: its process exited, or ``/health`` failed ``failures`` times
        in a row (``at_once``: one failed check is enough -- a failed episode or reload just hit it)."""
        if rid in self.dead:
            return
        replica = self.replicas[rid]
        if await self.healthy(replica):
            self._strikes[rid] = 0
            return
        self._strikes[rid] += 1
        exited = replica.alive is not None and not replica.alive()
        if rid in self.dead or not (at_once or exited or self._strikes[rid] >= self.config.failures):
            return
        self.declare_dead(rid, cause or ("engine process exited" if exited else
                                         f"/health failed {self._strikes[rid]} time(s) in a row"))

    async def died_since(self, rid: int, generation: int, grace_s: float = 2.0) -> bool:
        """Whether ``rid`` died after ``generation`` was read. A call on it just failed, so it is checked at
        once, and given ``grace_s`` to be seen dead (False: it lives; the failure was the caller's own)."""
        deadline = time.monotonic() + grace_s
        while self.generation[rid] == generation:
            await self.check(rid, at_once=True)
            if self.generation[rid] != generation:
                break
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def back(self, rid: int) -> None:
        """Wait until ``rid`` is back (restarted, or answering again); raise once its restarts are used up."""
        while rid in self.dead:
            if rid in self.given_up:
                raise RuntimeError(self.given_up[rid])
            await asyncio.sleep(0.05)

    def declare_dead(self, rid: int, cause: str) -> None:
        self.dead.add(rid)
        self.generation[rid] += 1
        self.deaths[rid] += 1
        self._strikes[rid] = 0
        self.replicas[rid].version = UNKNOWN_VERSION
        self.report(ReplicaDied(rid, cause))  # before any late TrajectoryFinished of its episodes
        orphans = self.orphan(rid)
        log.warning("replica %d died (%s); %d trajectories in flight on it are re-queued or recorded failed",
                    rid, cause, orphans)
        self.spawn(self._revive(rid))

    async def _revive(self, rid: int) -> None:
        """Restart a managed replica (or wait for an external one to answer again), then report it."""
        replica = self.replicas[rid]
        while True:
            if replica.restart is None:
                await asyncio.sleep(self.config.interval_s)
                if not await self.healthy(replica):
                    continue
            else:
                if self.restarts[rid] >= self.config.max_restarts:
                    self.given_up[rid] = (f"replica {rid} died {self.deaths[rid]} time(s); engine.max_restarts="
                                          f"{self.config.max_restarts} restarts used up")
                    self.report(RuntimeError(self.given_up[rid]))
                    return
                self.restarts[rid] += 1
                log.warning("restarting replica %d (restart %d of at most %d)", rid, self.restarts[rid],
                            self.config.max_restarts)
                try:
                    await replica.restart()
                except Exception as exc:  # noqa: BLE001 - counted; tried again up to max_restarts
                    log.warning("restarting replica %d failed: %r", rid, exc)
                    continue
                self.on_restart(rid)
            break
        self.dead.discard(rid)
        log.info("replica %d is back; it loads the newest weights before it serves", rid)
        self.report(ReplicaRestarted(rid))
