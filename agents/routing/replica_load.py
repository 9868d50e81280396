"""Each replica's load as a router reads it: the latest ``/metrics`` reading, refreshed about once a second.

Routing asks for a replica's load on every request; reading ``/metrics`` that often would cost one
HTTP call per request. :class:`LoadBoard` keeps the latest reading of every replica and, when one
is asked for and the readings are older than ``interval_s``, refreshes them all in the background
(one refresh at a time) while the caller gets what it has. A replica whose read fails keeps its
last reading (None before the first); :class:`~sao.agents.engine.meter.MetricsReader` logs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence

from ..engine import EngineMetrics
from ..engine.meter import MetricsReader, MetricsSource


class LoadBoard:
    """The latest reading of every source (module doc). Create it inside a running event loop."""

    def __init__(self, sources: Sequence[MetricsSource], *, interval_s: float = 1.0, timeout_s: float = 2.0):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.reader = MetricsReader(sources, timeout_s=timeout_s)
        self.interval_s = interval_s
        self.readings: list[EngineMetrics | None] = [None] * len(self.reader.sources)
        self.refreshes = 0  # refreshes started (each reads every source once)
        self._started = -math.inf
        self._task: asyncio.Task[None] | None = None

    def reading(self, rid: int) -> EngineMetrics | None:
        """Replica ``rid``'s latest reading (None: never read); starts a refresh when one is due."""
        now = time.monotonic()
        if (self._task is None or self._task.done()) and now - self._started >= self.interval_s:
            self._started = now
            self.refreshes += 1
            self._task = asyncio.ensure_future(self._refresh())
        return self.readings[rid]

    async def _refresh(self) -> None:
        for rid, reading in enumerate(await self.reader.read()):
            if reading is not None:
                self.readings[rid] = reading

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
