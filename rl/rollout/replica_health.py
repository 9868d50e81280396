"""Replica health for the rollout driver: what a replica is, and what its deaths and returns mean to the driver.

Each replica is watched by the one engine watcher, :class:`~sao.agents.engine.watch.EngineWatch`: a
check every ``health.interval_s``; one whose process exited (``Replica.alive``) or whose ``/health``
failed ``health.failures`` times in a row is dead. The driver also asks for a check at once when an
episode fails, so a crash is seen before its failed attempts count against their prompts. A dead
replica -> :class:`~sao.rl.rollout.schedulers.ReplicaDied` (applied to what the replica serves,
:mod:`sao.rl.rollout.served`; the scheduler re-queues or fails its in-flight attempts; the driver
cancels their tasks), then ``Replica.restart`` (a managed vLLM starts again on its port) or, for an
external engine, waiting for ``/health`` -> :class:`~sao.rl.rollout.schedulers.ReplicaRestarted` (the
scheduler syncs it to the newest version before it serves). Each death bumps the replica's
*generation*: a late answer of a past life (a reload that finishes after the death) is ignored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sao.agents.clients import CompletionClient
from sao.agents.engine import EngineRestartsExhausted, EngineWatch, Watched, WatchConfig, died_since
from sao.rl.rollout.schedulers import ReplicaDied, ReplicaRestarted
from sao.rl.weights import WeightControl

log = logging.getLogger(__name__)


class ReplicaControl(WeightControl, Protocol):
    """The control endpoints of one engine replica (``EngineClient`` on vLLM): a weight load's, and health."""

    async def health(self) -> bool: ...


@dataclass
class Replica:
    """One engine replica the driver runs episodes on: where completions go and how it is controlled.
    What it serves is :class:`~sao.rl.rollout.served.ServedVersions`'.

    ``alive``: a cheap liveness check (a managed server's process is running); None for an
    external engine, checked through ``control.health()`` only. ``restart``: start it again (same
    address); None when someone else owns the engine (the watch then waits for it to come back).
    """

    client: CompletionClient
    control: ReplicaControl
    alive: Callable[[], bool] | None = None
    restart: Callable[[], Awaitable[None]] | None = None

    def watched(self) -> Watched:
        return Watched(alive=self.alive, health=self.control.health, restart=self.restart)


@dataclass(frozen=True)
class HealthConfig(WatchConfig):
    """How replicas are watched (:class:`~sao.agents.engine.watch.WatchConfig`): a check every
    ``interval_s``; dead after ``failures`` failed ``/health`` calls in a row (each bounded by
    ``timeout_s``) or at once when ``alive()`` is False; at most ``max_restarts`` restarts per replica,
    after which the rollout loop stops."""

    interval_s: float = 5.0


class _ReplicaHooks:
    """What replica ``rid``'s watch tells the driver (its :class:`~sao.agents.engine.watch.WatchHooks`)."""

    def __init__(self, rid: int, replica: Replica, health: ReplicaHealth):
        self.rid, self.replica, self.health = rid, replica, health

    def died(self, cause: str, deaths: int) -> None:
        event = ReplicaDied(self.rid, cause)
        self.health.served(event)  # it serves unknown weights now
        self.health.report(event)  # before any late TrajectoryFinished of its episodes
        orphans = self.health.orphan(self.rid)
        log.warning("replica %d died (%s); %d trajectories in flight on it are re-queued or recorded failed",
                    self.rid, cause, orphans)

    def restarting(self, restart: int, limit: int) -> None:
        log.warning("restarting replica %d (restart %d of at most %d)", self.rid, restart, limit)

    def restart_failed(self, error: Exception) -> None:
        log.warning("restarting replica %d failed: %r", self.rid, error)

    def back(self, after_s: float) -> None:
        if self.replica.restart is not None:
            self.health.on_restart(self.rid)
        log.info("replica %d is back; it loads the newest weights before it serves", self.rid)
        self.health.report(ReplicaRestarted(self.rid))

    def gave_up(self, deaths: int, limit: int) -> str:
        message = f"replica {self.rid} died {deaths} time(s); engine.max_restarts={limit} restarts used up"
        self.health.report(RuntimeError(message))
        return message


class ReplicaHealth:
    """The driver's replicas, each under an :class:`~sao.agents.engine.watch.EngineWatch` (module doc).

    ``report``: where its events go (the driver's event queue): ``ReplicaDied``, ``ReplicaRestarted``,
    or an exception when a replica's restarts are used up. ``served``: applies a death to what the
    replica serves. ``orphan(rid)``: cancel the episodes in flight on a dead replica, returning how many.
    ``spawn``: run a helper task the driver owns. ``on_restart(rid)``: a replica was restarted.
    """

    def __init__(self, replicas: list[Replica], config: HealthConfig, *, report: Callable[[Any], None],
                 served: Callable[[ReplicaDied], None], orphan: Callable[[int], int],
                 spawn: Callable[[Awaitable[Any]], Any], on_restart: Callable[[int], None] = lambda rid: None):
        self.report, self.served, self.orphan, self.on_restart = report, served, orphan, on_restart
        self.watches = [EngineWatch(r.watched(), config, hooks=_ReplicaHooks(rid, r, self), spawn=spawn)
                        for rid, r in enumerate(replicas)]

    @property
    def dead(self) -> set[int]:
        """The replicas that do not serve now (being brought back, or given up)."""
        return {rid for rid, w in enumerate(self.watches) if not w.serving}

    @property
    def deaths(self) -> int:
        return sum(w.deaths for w in self.watches)

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self.watches)

    def generation(self, rid: int) -> int:
        """Replica ``rid``'s life: bumped at each of its deaths."""
        return self.watches[rid].generation

    def current(self, rid: int, generation: int) -> bool:
        """Whether ``rid`` is live and still in the life ``generation`` was read in."""
        return self.watches[rid].current(generation)

    async def watch(self) -> None:
        """Check every live replica each ``interval_s``."""
        await asyncio.gather(*(w.poll() for w in self.watches))

    async def check(self, rid: int, *, at_once: bool = False) -> None:
        """Declare ``rid`` dead if it is (``at_once``: one failed check is enough)."""
        await self.watches[rid].probe(at_once=at_once)

    async def died_since(self, rid: int, generation: int, grace_s: float = 2.0) -> bool:
        """Whether ``rid`` died after ``generation`` was read (a call on it just failed; False: it lives)."""
        return await died_since(self.watches[rid], generation, grace_s)

    async def back(self, rid: int) -> None:
        """Wait until ``rid`` is back (restarted, or answering again); raise once its restarts are used up."""
        try:
            await self.watches[rid].ready()
        except EngineRestartsExhausted as exc:
            raise RuntimeError(str(exc)) from None

    def declare_dead(self, rid: int, cause: str) -> None:
        self.watches[rid].declare_dead(cause)
