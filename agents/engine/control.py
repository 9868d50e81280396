"""A client for a vLLM server's control endpoints (pause, weights, versions).

:class:`EngineClient` talks to any vLLM server with ``VLLM_SERVER_DEV_MODE=1``, managed
(:class:`~.server.VLLMServer`) or remote.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import httpx

from ..errors import EngineError
from .metrics import EngineMetrics, parse_metrics

PauseMode = Literal["abort", "wait", "keep"]


class EngineClient:
    """Async client for a vLLM server's health and RL control endpoints (``VLLM_SERVER_DEV_MODE=1``).

    ``root_url`` is the server root, without ``/v1``. Every failed call raises :class:`EngineError`
    with the HTTP status (None when there was no answer) and the body.

    Weight versions in vLLM 0.32: the engine core keeps one label, the string ``"default"`` until
    set. ``POST /update_weight_version {"new_version": "..."}`` sets it (as does
    ``POST /finish_weight_update {"weight_version": ...}``), ``GET /weight_info`` returns
    ``{"weight_version": "..."}``. Neither ``/v1/completions`` nor ``/v1/chat/completions`` reports
    it; only the token-in/token-out route ``POST /inference/v1/generate`` does, per choice, as
    ``weight_versions: [{"version", "start", "end"}]`` spans over the output-token indexes.
    """

    def __init__(self, root_url: str, *, api_key: str | None = None, timeout_s: float = 60.0):
        self.root_url = root_url.rstrip("/")
        if self.root_url.endswith("/v1"):
            raise ValueError(f"EngineClient wants the server root, without /v1: {root_url!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.root_url, headers=headers, timeout=timeout_s)

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> bool:
        try:
            return (await self._http.get("/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def pause(self, *, mode: PauseMode = "abort", clear_cache: bool = True) -> None:
        """Stop scheduling. ``mode``: abort in-flight requests (vLLM's default), ``wait`` for them,
        or ``keep`` them frozen until :meth:`resume`. ``clear_cache`` (vLLM's default): drop the KV
        cache at the pause; in ``keep`` mode vLLM then preempts every request in flight, and each one
        computes its whole context again after the resume. ``False`` keeps their KV blocks."""
        await self._call("POST", "/pause", params={"mode": mode, "clear_cache": str(clear_cache).lower()})

    async def resume(self) -> None:
        await self._call("POST", "/resume")

    async def is_paused(self) -> bool:
        return bool(self._field(await self._call("GET", "/is_paused"), "is_paused"))

    async def reload_weights(self, path: str | Path, *, timeout_s: float | None = None) -> None:
        """Reload a safetensors checkpoint in place from ``path`` (a directory on the *server's*
        filesystem, best absolute). The prefix cache still holds keys computed with the old weights:
        call :meth:`reset_prefix_cache` after it, ideally between :meth:`pause` and :meth:`resume`."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        await self._call("POST", "/collective_rpc", json=body, timeout_s=timeout_s)

    async def set_weight_version(self, version: int | str) -> None:
        await self._call("POST", "/update_weight_version", json={"new_version": str(version)})

    async def served_model_dir(self) -> str | None:
        """The folder the server was started from (``root`` of ``GET /v1/models``), None if it says none."""
        data = await self._call("GET", "/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        return models[0].get("root") if models else None

    async def weight_version(self) -> str | None:
        """The engine's weight-version label (``GET /weight_info``); vLLM reports ``"default"`` until set."""
        value = self._field(await self._call("GET", "/weight_info"), "weight_version")
        return None if value is None else str(value)

    async def metrics(self) -> EngineMetrics:
        """The engine's counters and load from its Prometheus endpoint (``GET /metrics``)."""
        text = await self._call("GET", "/metrics")
        return parse_metrics(text if isinstance(text, str) else "")

    async def reset_prefix_cache(self) -> bool:
        """Drop the prefix (KV) cache; False when vLLM refused because blocks are still in use."""
        return bool(self._field(await self._call("POST", "/reset_prefix_cache"), "success"))

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        try:
            resp = await self._http.request(method, path, json=json, params=params, **extra)
        except httpx.HTTPError as err:
            raise EngineError(f"{method} {self.root_url}{path}: no answer ({type(err).__name__}: {err})") from err
        if resp.status_code >= 400:
            hint = " (is the server running with VLLM_SERVER_DEV_MODE=1?)" if resp.status_code == 404 else ""
            raise EngineError(
                f"{method} {self.root_url}{path}: HTTP {resp.status_code}{hint}: {resp.text[:500]}",
                status_code=resp.status_code,
                body=resp.text,
            )
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    def _field(self, data: Any, key: str) -> Any:
        if not isinstance(data, dict) or key not in data:
            raise EngineError(f"unexpected answer from {self.root_url}, no {key!r}: {data!r}", body=repr(data))
        return data[key]
