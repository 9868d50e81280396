"""A replica's client and control that follow the replica's current URL (an engine that moves).

A managed local vLLM restarts on its own port, so its clients keep their address. A replica on a Ray
cluster (:mod:`sao.rl.cluster.replicas`) comes back as a new actor, on whichever node has the resources,
with a new URL. :class:`FollowingClient` and :class:`FollowingControl` read the replica's URL at
each call (``address()``; None while it is down) and build a fresh inner client when it changed, so
the :class:`~sao.rl.rollout.replica_health.Replica` the driver holds stays the same object across restarts.

``FollowingControl(localize=...)``: a weight reload's folder is first made readable on the
replica's node (:mod:`sao.rl.weights.staging`: shipped through Ray's object store) and the engine is
told the node-local path. Nothing here imports Ray.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from sao.agents import Completion, EngineError, EngineUnavailableError
from sao.agents.clients import SamplingParams
from sao.agents.engine import EngineMetrics, PauseMode


class Closeable(Protocol):
    async def aclose(self) -> None: ...


C = TypeVar("C", bound=Closeable)


class _Follower(Generic[C]):
    """The inner client of the current URL; past ones are closed at :meth:`aclose` (requests in
    flight on a dead replica's client end on their own)."""

    def __init__(self, address: Callable[[], str | None], make: Callable[[str], C]):
        self.address, self.make = address, make
        self._url: str | None = None
        self._inner: C | None = None
        self._retired: list[C] = []

    def current(self) -> C | None:
        url = self.address()
        if url is None:
            return None
        if url != self._url:
            if self._inner is not None:
                self._retired.append(self._inner)
            self._inner, self._url = self.make(url), url
        return self._inner

    async def aclose(self) -> None:
        for inner in [*self._retired, *([self._inner] if self._inner is not None else [])]:
            await inner.aclose()
        self._retired.clear()
        self._inner, self._url = None, None


class CompletionInner(Closeable, Protocol):
    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion: ...


class FollowingClient:
    """A :class:`~sao.agents.clients.completions.CompletionClient` on the replica's current URL (module doc).
    While the replica is down a request fails as an unreachable engine would."""

    def __init__(self, address: Callable[[], str | None], make: Callable[[str], CompletionInner]):
        self._follow: _Follower[CompletionInner] = _Follower(address, make)

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        inner = self._follow.current()
        if inner is None:
            raise EngineUnavailableError("the engine replica is down (being restarted)")
        return await inner.complete(prompt_ids, params)

    async def aclose(self) -> None:
        await self._follow.aclose()


class ControlInner(Closeable, Protocol):
    """The control endpoints the driver uses (``EngineClient``)."""

    root_url: str

    async def health(self) -> bool: ...

    async def pause(self, *, mode: PauseMode = "abort", clear_cache: bool = True) -> None: ...

    async def resume(self) -> None: ...

    async def reload_weights(self, path: str | Path, *, timeout_s: float | None = None) -> None: ...

    async def set_weight_version(self, version: int | str) -> None: ...

    async def reset_prefix_cache(self) -> bool: ...

    async def metrics(self) -> EngineMetrics: ...

    async def served_model_dir(self) -> str | None: ...


class FollowingControl:
    """The control endpoints of the replica's current URL (module doc): a
    :class:`~sao.rl.rollout.replica_health.ReplicaControl` and a metrics source. ``localize(folder)``
    returns where the replica's node reads ``folder`` (default: the same path, a shared filesystem)."""

    def __init__(self, address: Callable[[], str | None], make: Callable[[str], ControlInner], *,
                 localize: Callable[[Path], Awaitable[str]] | None = None):
        self._follow: _Follower[ControlInner] = _Follower(address, make)
        self.localize = localize

    @property
    def root_url(self) -> str:
        return self._follow.address() or "(down)"

    def _inner(self) -> ControlInner:
        inner = self._follow.current()
        if inner is None:
            raise EngineError("the engine replica is down (being restarted)")
        return inner

    async def health(self) -> bool:
        inner = self._follow.current()
        return inner is not None and await inner.health()

    async def pause(self, *, mode: PauseMode = "abort", clear_cache: bool = True) -> None:
        await self._inner().pause(mode=mode, clear_cache=clear_cache)

    async def resume(self) -> None:
        await self._inner().resume()

    async def reload_weights(self, path: str | Path, *, timeout_s: float | None = None) -> None:
        inner = self._inner()  # the replica this load is for: a restart meanwhile fails the reload below
        local = await self.localize(Path(path)) if self.localize is not None else str(path)
        await inner.reload_weights(local, timeout_s=timeout_s)

    async def set_weight_version(self, version: int | str) -> None:
        await self._inner().set_weight_version(version)

    async def reset_prefix_cache(self) -> bool:
        return await self._inner().reset_prefix_cache()

    async def metrics(self) -> EngineMetrics:
        return await self._inner().metrics()

    async def served_model_dir(self) -> str | None:
        return await self._inner().served_model_dir()

    async def aclose(self) -> None:
        await self._follow.aclose()

