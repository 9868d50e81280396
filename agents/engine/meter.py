"""Several engines' ``/metrics`` counters, window by window: what they did between two readings, summed.

:class:`MetricsReader` reads every replica at once; :class:`EngineMeter` keeps each one's last reading. :meth:`~EngineMeter.window` reads every
replica at once and returns the counters' growth since the previous window, summed over the
replicas that could be read both times (:func:`~sao.agents.engine.metrics.combined`; gauges are
this reading's). Training takes one window per step, ``sao-eval`` one over its episodes.

Reading never fails the caller:

* a replica that cannot be read (dead, hung: each read is bounded by ``timeout_s``) is left out
  of this window and keeps its last reading, so the next window counts its growth over both; the
  first failure of a replica is logged as a warning, later ones until it answers again at debug;
* a counter that went down means the engine restarted (its counters start at 0 again): its
  growth is the new reading itself (what it did since the restart);
* a replica never read before gives its first reading as the baseline and adds nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import fields
from typing import Protocol

from .metrics import EngineMetrics, combined

log = logging.getLogger(__name__)


class MetricsSource(Protocol):
    """An engine whose ``/metrics`` can be read (``EngineClient`` is one)."""

    async def metrics(self) -> EngineMetrics: ...


_COUNTERS = tuple(f.name for f in fields(EngineMetrics) if f.name not in ("running", "waiting", "kv_cache_usage"))


def restarted(now: EngineMetrics, before: EngineMetrics) -> bool:
    """Whether some counter went down from ``before`` to ``now`` (the engine started again)."""
    return any(getattr(now, name) < getattr(before, name) for name in _COUNTERS)


class MetricsReader:
    """Reads every source at once, each bounded by ``timeout_s``; a failed read is None, logged (module doc)."""

    def __init__(self, sources: Sequence[MetricsSource], *, timeout_s: float = 5.0):
        self.sources, self.timeout_s = list(sources), timeout_s
        self._failing = [False] * len(self.sources)

    async def read(self) -> list[EngineMetrics | None]:
        return list(await asyncio.gather(*(self._read(i) for i in range(len(self.sources)))))

    async def _read(self, i: int) -> EngineMetrics | None:
        try:
            reading = await asyncio.wait_for(self.sources[i].metrics(), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a failed read leaves this replica out, never fails the caller
            log.log(logging.DEBUG if self._failing[i] else logging.WARNING,
                    "replica %d: /metrics could not be read (%s: %s); it is left out until it answers", i,
                    type(exc).__name__, exc)
            self._failing[i] = True
            return None
        if self._failing[i]:
            log.info("replica %d: /metrics is read again", i)
            self._failing[i] = False
        return reading


class EngineMeter:
    """Windows of the counters of ``sources`` (module doc)."""

    def __init__(self, sources: Sequence[MetricsSource], *, timeout_s: float = 5.0):
        self.reader = MetricsReader(sources, timeout_s=timeout_s)
        self._last: list[EngineMetrics | None] = [None] * len(self.reader.sources)
        self.read = 0  # replicas counted in the latest window

    async def start(self) -> None:
        """Take the baseline (what came before does not count)."""
        await self.window()

    async def window(self) -> EngineMetrics | None:
        """The growth since the last window over the replicas read now and then; None when no replica
        was read both times."""
        grown = []
        for i, now in enumerate(await self.reader.read()):
            if now is None:
                continue
            before, self._last[i] = self._last[i], now
            if before is not None:
                grown.append(now if restarted(now, before) else now.since(before))
        self.read = len(grown)
        return combined(grown) if grown else None
