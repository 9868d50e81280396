"""A bounded pool of fresh sandboxes for concurrent episodes (asyncio).

::

    pool = SandboxPool(lambda: DockerSandbox(BASE_IMAGE, label=run_label), max_concurrent=8, warm=2)
    async with pool:                      # starts the warm sandboxes; closes everything at the end
        async with pool.sandbox() as sb:  # waits while 8 are handed out
            result = await asyncio.to_thread(sb.run, "pytest -q")

Rules: at most ``max_concurrent`` sandboxes are handed out at once; up to ``warm`` more are kept
started and idle so that an episode does not wait for a container to boot (at most
``max_concurrent + warm`` exist at once). A sandbox is handed out once only, and is closed when
it comes back, never reused (episodes must not see each other's state); a new warm one is then
started in the background. Sandboxes are created and closed in worker threads
(``asyncio.to_thread``), since both block. A factory error while an episode waits is raised to
that episode (its slot is freed); a factory error while warming is logged and the pool then
creates sandboxes on demand.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from .base import Sandbox
from .errors import SandboxClosedError

log = logging.getLogger(__name__)


class SandboxPool:
    """Hands out fresh sandboxes from ``factory`` with bounded concurrency (see the module docstring)."""

    def __init__(self, factory: Callable[[], Sandbox], *, max_concurrent: int, warm: int = 0):
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1 (got {max_concurrent})")
        if warm < 0:
            raise ValueError(f"warm must be >= 0 (got {warm})")
        self.factory = factory
        self.max_concurrent = max_concurrent
        self.warm = warm
        self._slots: asyncio.Semaphore | None = None
        self._ready: deque[Sandbox] = deque()
        self._starting = 0
        self._in_use: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._warm_failed = False

    @property
    def in_use(self) -> int:
        return len(self._in_use)

    @property
    def ready(self) -> int:
        return len(self._ready)

    async def start(self) -> None:
        """Start the warm sandboxes and wait until they are ready (optional: ``sandbox()`` also warms)."""
        self._check_open()
        self._refill()
        await self._settle()

    @asynccontextmanager
    async def sandbox(self) -> AsyncIterator[Sandbox]:
        """A fresh sandbox for the body of the ``async with``; closed afterwards."""
        self._check_open()
        slots = self._semaphore()
        await slots.acquire()
        try:
            self._check_open()
            if self._ready:
                sandbox = self._ready.popleft()
            else:
                sandbox = await asyncio.to_thread(self.factory)
                self._warm_failed = False  # the factory works (again): resume warming
        except BaseException:
            slots.release()
            raise
        key = id(sandbox)
        assert key not in self._in_use, "a sandbox was handed out twice"
        self._in_use.add(key)
        self._refill()
        try:
            yield sandbox
        finally:
            self._in_use.discard(key)
            try:
                await asyncio.to_thread(_close_quietly, sandbox)
            finally:
                slots.release()
                self._refill()

    async def close(self) -> None:
        """Stop warming, wait for starts in flight, and close every idle sandbox; idempotent.

        Sandboxes still handed out are closed by their ``async with`` blocks as they finish.
        """
        if self._closed:
            return
        self._closed = True
        await self._settle()
        while self._ready:
            await asyncio.to_thread(_close_quietly, self._ready.popleft())

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- internals --------------------------------------------------------------------------

    def _semaphore(self) -> asyncio.Semaphore:
        if self._slots is None:  # created lazily, inside the running loop
            self._slots = asyncio.Semaphore(self.max_concurrent)
        return self._slots

    def _refill(self) -> None:
        if self._closed or self._warm_failed:
            return
        while len(self._ready) + self._starting < self.warm:
            self._starting += 1
            task = asyncio.get_running_loop().create_task(self._start_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _start_one(self) -> None:
        try:
            sandbox = await asyncio.to_thread(self.factory)
        except Exception as exc:  # noqa: BLE001 - the next acquire creates on demand and raises there
            log.warning("could not start a warm sandbox (warming stops): %s", exc)
            self._warm_failed = True
            return
        finally:
            self._starting -= 1
        if self._closed:
            await asyncio.to_thread(_close_quietly, sandbox)
        else:
            self._ready.append(sandbox)

    async def _settle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError("the sandbox pool is closed")


def _close_quietly(sandbox: Sandbox) -> None:
    try:
        sandbox.close()
    except Exception as exc:  # noqa: BLE001 - never mask the episode's own outcome
        log.warning("could not close sandbox %r: %s", sandbox, exc)
