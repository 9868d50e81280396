"""One engine's life watched: its death noticed, the engine brought back, the work its death cut run again.

This is the one engine watcher: ``sao-eval``'s managed engine (below) and each replica of the
training driver (:mod:`sao.rl.rollout.replica_health`, through :class:`Watched` and its own
:class:`WatchHooks`) are watched by an :class:`EngineWatch`.

:class:`EngineWatch` looks at the engine every ``interval_s``: its process (``running``), and, for an
engine with a ``/health`` probe, that probe (dead after ``failures`` failed calls in a row). When its
process has exited (a crash, the OOM killer, a stray ``kill -9``), the watch

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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

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
    """How an engine is watched: looked at every ``interval_s``; dead at once when its process has
    exited, or (an engine with a ``/health`` probe) after ``failures`` failed calls in a row, each
    bounded by ``timeout_s``; restarted at most ``max_restarts`` times in all."""

    interval_s: float = 0.2  # how often the process is looked at (a cheap waitpid)
    max_restarts: int = 3
    failures: int = 3
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.max_restarts < 0:
            raise ValueError(f"interval_s must be > 0 and max_restarts >= 0, got {self.interval_s} and "
                             f"{self.max_restarts}")


@dataclass(frozen=True)
class Watched:
    """How a watch sees one engine and acts on it.

    ``alive``: a cheap look at its process (None: no process of ours to look at). ``health``: its
    ``/health`` (None: the process is all there is to look at). ``restart``: start it again at the same
    address (None: someone else owns it; the watch waits until it answers again). ``stop``: once its
    restarts are used up, leave nothing of it behind."""

    alive: Callable[[], bool] | None = None
    health: Callable[[], Awaitable[bool]] | None = None
    restart: Callable[[], Awaitable[None]] | None = None
    stop: Callable[[], Awaitable[None]] | None = None


def managed(engine: ManagedEngine, on_restart: Callable[[], Awaitable[None]] | None = None) -> Watched:
    """A managed engine as a watch sees it: its process, restarted (then ``on_restart``) and stopped in a
    thread of their own (:func:`in_own_thread`)."""

    async def restart() -> None:
        await in_own_thread(engine.restart)
        if on_restart is not None:
            await on_restart()

    async def stop() -> None:
        await in_own_thread(engine.stop)

    return Watched(alive=lambda: engine.running, restart=restart, stop=stop)


class WatchHooks(Protocol):
    """What the watch tells its owner, who words the logs and turns them into its own records."""

    def died(self, cause: str, deaths: int) -> None: ...  # declared dead (its generation already bumped)

    def restarting(self, restart: int, limit: int) -> None: ...

    def restart_failed(self, error: Exception) -> None: ...  # counted; tried again while restarts are left

    def back(self, after_s: float) -> None: ...  # it serves again (``after_s`` since its restart began)

    def gave_up(self, deaths: int, limit: int) -> str: ...  # restarts used up: the message the run ends with


class EngineLog:
    """The hooks of a managed engine under ``sao-eval``: logs only."""

    def died(self, cause: str, deaths: int) -> None:
        log.warning("the engine's process exited (death %d); the episodes in flight on it are cut and run again "
                    "once it is back", deaths)

    def restarting(self, restart: int, limit: int) -> None:
        log.warning("restarting the engine (restart %d of at most %d)", restart, limit)

    def restart_failed(self, error: Exception) -> None:
        log.warning("restarting the engine failed: %s", error)

    def back(self, after_s: float) -> None:
        log.warning("the engine is back after %.0f s", after_s)

    def gave_up(self, deaths: int, limit: int) -> str:
        message = f"the managed engine died {deaths} time(s) and its {limit} restart(s) are used up (max_restarts={limit})"
        log.error("%s; no episode runs any more", message)
        return message


class EngineWatch:
    """Notices an engine's death and brings it back (module doc). Use as ``async with`` (which runs
    :meth:`poll`), or run :meth:`poll` where the owner wants it. ``engine``: a :class:`ManagedEngine`
    (restarted, then ``on_restart``) or a :class:`Watched`; ``hooks``: who hears of its deaths and
    returns (default :class:`EngineLog`); ``spawn``: runs its helper tasks (default: its own, ended at
    the block's exit)."""

    def __init__(self, engine: ManagedEngine | Watched, config: WatchConfig = WatchConfig(), *,
                 on_restart: Callable[[], Awaitable[None]] | None = None, hooks: WatchHooks | None = None,
                 spawn: Callable[[Coroutine[Any, Any, None]], object] | None = None):
        self.engine = engine if isinstance(engine, Watched) else managed(engine, on_restart)
        self.config, self.hooks = config, hooks if hooks is not None else EngineLog()
        self.generation = 0  # bumped at each death: late answers of a past life are ignored
        self.deaths = 0
        self.restarts = 0
        self.death = asyncio.Event()  # set when the current generation dies; a new one per generation
        self._serving = asyncio.Event()
        self._serving.set()
        self._gave_up: EngineRestartsExhausted | None = None
        self._strikes = 0  # failed looks in a row
        self._tasks: list[asyncio.Task[None]] = []
        self._spawn = spawn if spawn is not None else self._own_task

    async def __aenter__(self) -> EngineWatch:
        self._own_task(self.poll())
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

    def current(self, generation: int) -> bool:
        """Whether it serves and is still in the life ``generation`` was read in."""
        return self.serving and generation == self.generation

    async def ready(self) -> int:
        """Wait until the engine serves; return its generation. :class:`EngineRestartsExhausted` when
        it never will again."""
        await self._serving.wait()
        if self._gave_up is not None:
            raise EngineRestartsExhausted(str(self._gave_up))
        return self.generation

    async def poll(self) -> None:
        """Look at the engine every ``interval_s`` (:meth:`probe`), forever."""
        while True:
            await asyncio.sleep(self.config.interval_s)
            await self.probe()

    def check(self) -> None:
        """Declare the engine dead if its process has exited (nothing while it is being brought back,
        nor once the restarts are used up)."""
        if self.serving and self._exited():
            self.declare_dead("engine process exited")

    async def probe(self, *, at_once: bool = False, cause: str | None = None) -> None:
        """Declare the engine dead if it is: its process exited, or ``/health`` failed ``failures`` times
        in a row (``at_once``: one failed look is enough -- a failed request or reload just hit it)."""
        if not self.serving:
            return
        if await self._healthy():
            self._strikes = 0
            return
        self._strikes += 1
        exited = self._exited()
        if not self.serving or not (at_once or exited or self._strikes >= self.config.failures):
            return
        self.declare_dead(cause or ("engine process exited" if exited else
                                    f"/health failed {self._strikes} time(s) in a row"))

    def declare_dead(self, cause: str) -> None:
        """It is dead: a new generation; those waiting on :attr:`death` wake; it is brought back."""
        self.generation += 1
        self.deaths += 1
        self._strikes = 0
        self._serving.clear()
        died, self.death = self.death, asyncio.Event()
        died.set()
        self.hooks.died(cause, self.deaths)
        self._spawn(self._revive())

    def _exited(self) -> bool:
        return self.engine.alive is not None and not self.engine.alive()

    async def _healthy(self) -> bool:
        if self._exited():
            return False
        if self.engine.health is None:
            return True
        try:
            return bool(await asyncio.wait_for(self.engine.health(), self.config.timeout_s))
        except Exception:  # noqa: BLE001 - no answer is an unhealthy answer
            return False

    def _own_task(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(work))

    async def _revive(self) -> None:
        """Bring the engine back; whatever happens, those waiting in :meth:`ready` are let go (to run,
        or to raise)."""
        back = False
        try:
            back = await self._bring_back()
        finally:
            if not back and self._gave_up is None:  # cancelled, or an unexpected error
                self._gave_up = EngineRestartsExhausted(f"the managed engine died {self.deaths} time(s) and "
                                                        "was not brought back")
            self._serving.set()

    async def _bring_back(self) -> bool:
        """Restart it (what is left of it is stopped first), up to ``max_restarts`` times in all, or wait
        until an engine someone else owns answers again. True once it is back; False when the restarts
        are used up (it is stopped then)."""
        engine, limit = self.engine, self.config.max_restarts
        while engine.restart is None:
            await asyncio.sleep(self.config.interval_s)
            if await self._healthy():
                self.hooks.back(0.0)
                return True
        while self.restarts < limit:
            self.restarts += 1
            self.hooks.restarting(self.restarts, limit)
            started = time.monotonic()
            try:
                await engine.restart()
            except Exception as exc:  # noqa: BLE001 - counted as a restart; tried again while any are left
                self.hooks.restart_failed(exc)
                continue
            self.hooks.back(time.monotonic() - started)
            return True
        self._gave_up = EngineRestartsExhausted(self.hooks.gave_up(self.deaths, limit))
        if engine.stop is not None:
            try:
                await engine.stop()  # leave no process of it behind
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
    """Whether the engine died after ``generation`` was read. A call on it just failed, so it is looked at
    at once, and given up to ``grace_s`` to be seen dead (a process is reaped by another thread); False:
    it lives, the failure was the caller's own."""
    deadline = time.monotonic() + grace_s
    while watch.generation == generation:
        await watch.probe(at_once=True)
        if watch.generation != generation:
            break
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


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
