"""A managed engine kept alive through an evaluation, and the episodes its deaths cut run again.

:class:`EngineWatch` looks at the engine's process (``running``) every ``interval_s``. When it has
exited (a crash, the OOM killer, a stray ``kill -9``), the watch

1. bumps its *generation* and wakes the episodes in flight on the dead engine;
2. stops what is left of the engine's process tree (vLLM's EngineCore outlives a killed API server;
   ``VLLMServer.restart`` SIGTERMs the process group, waits, SIGKILLs it) and starts it again on
   the same port, so that the clients keep their address: at most ``max_restarts`` times, each logged;
3. runs ``on_restart`` (when given: training loads the current weights into the fresh engine, which
   starts from the weights it was launched with), then lets the episodes run again.

:func:`rerun_on_death` plays one episode under the watch. An attempt that the engine's death cut is
cancelled and dropped (never returned, so never written or counted), and the episode starts again
from its beginning, with the same seed, on the restarted engine. An attempt that ended ``failed``
makes the watch look at once, so that a death an episode saw first is not recorded as its result.
With the restarts used up, :class:`EngineRestartsExhausted` ends the run: finished episodes are
kept (they were written as they ended), and a resumed run plays the rest. :func:`retry_on_death`
does the same for one call that is not an episode (a weight load, a version read): it is made again
once the engine is back when the engine died under it.

Training watches its replicas in :mod:`sao.rl.rollout.replica_health`, which also re-syncs their weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..errors import EngineError
from ..records import Trajectory

log = logging.getLogger(__name__)

T = TypeVar("T")


class ManagedEngine(Protocol):
    """An engine the run owns (:class:`~sao.agents.engine.server.VLLMServer` is one)."""

    @property
    def running(self) -> bool: ...  # its process has not exited

    def restart(self) -> object: ...  # stop what is left, start again at the same address, block until healthy

    def stop(self) -> None: ...  # stop it and every process under it


class EngineRestartsExhausted(EngineError):
    """The managed engine died once more than ``max_restarts`` allows."""


@dataclass(frozen=True)
class WatchConfig:
    interval_s: float = 0.2  # how often the process is looked at (a cheap waitpid)
    max_restarts: int = 3

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.max_restarts < 0:
            raise ValueError(f"interval_s must be > 0 and max_restarts >= 0, got {self.interval_s} and "
                             f"{self.max_restarts}")


class EngineWatch:
    """Notices a managed engine's death and brings it back (module doc). Use as ``async with``."""

    def __init__(self, engine: ManagedEngine, config: WatchConfig = WatchConfig(), *,
                 on_restart: Callable[[], Awaitable[None]] | None = None):
        self.engine, self.config = engine, config
        self.on_restart = on_restart  # after each restart, before anything runs on the engine again
        self.generation = 0  # bumped at each death
        self.deaths = 0
        self.restarts = 0
        self.death = asyncio.Event()  # set when the current generation dies; a new one per generation
        self._serving = asyncio.Event()
        self._serving.set()
        self._gave_up: EngineRestartsExhausted | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> EngineWatch:
        self._tasks.append(asyncio.create_task(self._poll(), name="engine-watch"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def serving(self) -> bool:
        """Whether the engine takes requests now (not being brought back, restarts not used up)."""
        return self._serving.is_set() and self._gave_up is None

    @property
    def exhausted(self) -> bool:
        """Whether it died with its restarts used up: it never serves again."""
        return self._gave_up is not None

    async def ready(self) -> int:
        """Wait until the engine serves; return its generation. :class:`EngineRestartsExhausted` when
        it never will again."""
        await self._serving.wait()
        if self._gave_up is not None:
            raise EngineRestartsExhausted(str(self._gave_up))
        return self.generation

    def check(self) -> None:
        """Declare the engine dead if its process has exited (nothing while it is being brought back,
        nor once the restarts are used up)."""
        if self._gave_up is not None or not self._serving.is_set() or self.engine.running:
            return
        self.generation += 1
        self.deaths += 1
        self._serving.clear()
        died, self.death = self.death, asyncio.Event()
        died.set()
        log.warning("the engine's process exited (death %d); the episodes in flight on it are cut and run again "
                    "once it is back", self.deaths)
        self._tasks.append(asyncio.create_task(self._revive(), name="engine-revive"))

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            self.check()

    async def _revive(self) -> None:
        """Restart the engine (what is left of it is stopped first), up to ``max_restarts`` times in all;
        whatever happens, the episodes waiting in :meth:`ready` are let go (to run, or to raise)."""
        back = False
        try:
            back = await self._restart()
        finally:
            if not back and self._gave_up is None:  # cancelled, or an unexpected error
                self._gave_up = EngineRestartsExhausted(f"the managed engine died {self.deaths} time(s) and "
                                                        "was not brought back")
            self._serving.set()

    async def _restart(self) -> bool:
        """True once the engine is back; False when the restarts are used up (it is stopped then)."""
        limit = self.config.max_restarts
        while self.restarts < limit:
            self.restarts += 1
            log.warning("restarting the engine (restart %d of at most %d)", self.restarts, limit)
            started = time.monotonic()
            try:
                await in_own_thread(self.engine.restart)
                if self.on_restart is not None:
                    await self.on_restart()
            except Exception as exc:  # noqa: BLE001 - counted as a restart; tried again while any are left
                log.warning("restarting the engine failed: %s", exc)
                continue
            log.warning("the engine is back after %.0f s", time.monotonic() - started)
            return True
        self._gave_up = EngineRestartsExhausted(
            f"the managed engine died {self.deaths} time(s) and its {limit} restart(s) are used up "
            f"(max_restarts={limit})")
        log.error("%s; no episode runs any more", self._gave_up)
        try:
            await in_own_thread(self.engine.stop)  # leave no process of it behind
        except Exception as exc:  # noqa: BLE001 - the run ends anyway; the server's exit stops it again
            log.warning("stopping the dead engine failed: %s", exc)
        return False


async def until_death(watch: EngineWatch, work: Awaitable[T]) -> asyncio.Future[T]:
    """Run ``work`` until it ends or the engine dies, whichever comes first; the finished future, which
    is cancelled when the death came first (it was let close what it holds; what it ends with is dropped)."""
    run = asyncio.ensure_future(work)
    death = asyncio.ensure_future(watch.death.wait())
    try:
        await asyncio.wait({run, death}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        death.cancel()
        if not run.done():
            run.cancel()
            await asyncio.wait({run})
    return run


async def rerun_on_death(watch: EngineWatch | None, attempt: Callable[[], Awaitable[Trajectory]]) -> Trajectory:
    """Play one episode (``attempt()``, from its start) until an attempt ends on an engine that did not
    die under it; return that attempt's trajectory. Without a watch, one attempt (module doc)."""
    if watch is None:
        return await attempt()
    while True:
        generation = await watch.ready()
        run = await until_death(watch, attempt())
        if not run.cancelled():  # it ended by itself
            error = run.exception()
            trajectory = run.result() if error is None else None
            if trajectory is not None and (trajectory.status == "ok" or trajectory.env_error):
                return trajectory
            watch.check()  # it failed: did the engine die under it?
            if watch.generation == generation:
                if error is not None:
                    raise error  # not a cut attempt: the caller's own error
                assert trajectory is not None
                return trajectory
        log.info("an episode cut by the engine's death runs again")


async def retry_on_death(watch: EngineWatch | None, call: Callable[[], Awaitable[T]], *,
                         grace_s: float = 2.0) -> T:
    """``await call()``, made again once the engine is back when it raised because the engine died
    under it; its own errors (on an engine that lives) pass through. Without a watch, one call.

    A request cut by the death can fail a moment before the engine's exit is seen (the process is
    reaped by another thread): the watch is given ``grace_s`` to see it before the error counts."""
    if watch is None:
        return await call()
    while True:
        generation = await watch.ready()
        try:
            return await call()
        except Exception:
            if not await died_since(watch, generation, grace_s):
                raise
        log.info("a call cut by the engine's death is made again")


async def died_since(watch: EngineWatch, generation: int, grace_s: float = 2.0) -> bool:
    """Whether the engine died after ``generation`` was read, giving the watch up to ``grace_s`` to see
    a death that a failed request saw first (the process is reaped by another thread)."""
    deadline = time.monotonic() + grace_s
    while watch.generation == generation and time.monotonic() < deadline:
        watch.check()
        if watch.generation == generation:
            await asyncio.sleep(0.05)
    return watch.generation != generation


async def in_own_thread(fn: Callable[[], object]) -> None:
    """``fn()`` in a daemon thread of its own. Unlike ``asyncio.to_thread``, a wait cancelled at the
    run's end leaves the thread behind without the event loop's shutdown waiting for it (a restart
    can take minutes; the server's own stop at exit ends it)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting coroutine
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="engine-restart", daemon=True).start()
    await done


@contextlib.asynccontextmanager
async def watching(engine: ManagedEngine | None, max_restarts: int, *,
                   on_restart: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[EngineWatch | None]:
    """An :class:`EngineWatch` over ``engine`` for the block; None when there is no managed engine."""
    if engine is None:
        yield None
        return
    async with EngineWatch(engine, WatchConfig(max_restarts=max_restarts), on_restart=on_restart) as watch:
        yield watch
