"""Loading a published weight version into one running engine: the one reload sequence.

pause (``mode="keep"``: in-flight requests wait, then continue on the new weights) -> reload the
version's folder -> set the engine's version label -> reset the prefix cache (its blocks were
computed with the old weights) -> resume, whatever happened. :class:`~sao.rl.weights.sync.WeightSync`
(``rollout=sync``) and the rollout driver (every other mode) both load through :func:`load_weights`.

What a ``keep`` load costs the requests in flight: by default (``keep_kv=False``) vLLM drops the KV
cache at the pause, which preempts every running request; after the resume each one computes its
prompt and the tokens it had generated again, on the new weights, before it generates its next token.
That recomputation is the cost of an update, and it grows with the tokens in flight
(``benchmarks/interruption.py`` measures it). ``keep_kv=True`` keeps their KV blocks, computed with
the old weights (PipelineRL's in-flight updates): the requests go on at once, their later tokens are
sampled by the new weights over an old-weights cache, and the prefix cache cannot be reset while those
blocks are in use (``Loaded.prefix_cache_reset`` is then False).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sao.agents.engine import PauseMode


class WeightControl(Protocol):
    """The engine endpoints a weight load uses (``EngineClient`` on vLLM)."""

    async def pause(self, *, mode: PauseMode = "abort", clear_cache: bool = True) -> None: ...

    async def resume(self) -> None: ...

    async def reload_weights(self, path: str | Path, *, timeout_s: float | None = None) -> None: ...

    async def set_weight_version(self, version: int | str) -> None: ...

    async def reset_prefix_cache(self) -> bool: ...


@dataclass(frozen=True)
class Served:
    """Event: engine replica ``replica`` serves weights ``version`` from now on (a load of it is in and it
    resumes). ``pushed``: the learner's weight sync made that load (``rollout=sync``,
    :mod:`sao.rl.weights.replica_sync`), not the rollout driver. The rollout driver's record of what each
    replica serves applies it (:mod:`sao.rl.rollout.served`)."""

    replica: int
    version: int
    pushed: bool = False


@dataclass(frozen=True)
class Loaded:
    """What one load took: the reload's seconds, and whether the engine reset its prefix cache
    (vLLM refuses while blocks are in use)."""

    reload_s: float
    prefix_cache_reset: bool


async def load_weights(engine: WeightControl, folder: str | Path, version: int, *, mode: PauseMode = "keep",
                       timeout_s: float | None = None, keep_kv: bool = False,
                       before_resume: Callable[[bool], None] = lambda reset: None) -> Loaded:
    """Load ``folder`` (version ``version``) into ``engine`` (module doc). ``before_resume(reset)`` runs
    once the new weights are in, while the engine is still paused, with whether the prefix cache was
    reset (the driver records the replica's version and the state of its KV cache there, so no answer
    that comes back after the resume reads the old ones). ``keep_kv``: the requests in flight keep their
    old-weights KV blocks instead of recomputing them (module doc)."""
    await engine.pause(mode=mode, clear_cache=not keep_kv)
    try:
        started = time.perf_counter()
        await engine.reload_weights(folder, timeout_s=timeout_s)
        reload_s = time.perf_counter() - started
        await engine.set_weight_version(version)
        cache_reset = await engine.reset_prefix_cache()
        before_resume(cache_reset)
    finally:
        await engine.resume()
    return Loaded(reload_s, cache_reset)
