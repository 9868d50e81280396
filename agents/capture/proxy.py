"""The capture proxy: an OpenAI-compatible chat server in front of the engine, one session per episode.

    async with CaptureProxy() as proxy:                      # 127.0.0.1, any free port
        with proxy.session(upstream, PinnedSampling(1.0)) as session:
            run_agent(base_url=session.base_url, model=session.model, api_key=session.api_key)
            assembled = session.assemble()

It runs in the caller's asyncio loop (aiohttp) and serves, per session,
``POST /sessions/<id>/v1/chat/completions`` (streamed or not, with tools) and ``GET /sessions/<id>/v1/models``,
so an unchanged client needs only its base URL. A call to an unknown or closed session is a 404, a body it
cannot serve a 400 (:mod:`.requests`), a prompt over the context a 400 that says so (as vLLM's), an engine
failure a 502 (recorded as a failed call): OpenAI's error shape every time, and the proxy goes on.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Any

from aiohttp import web

from ..errors import ContextOverflowError, EngineError, EngineRequestError
from .requests import BadChatRequest, parse_chat_request
from .responses import chat_completion, chunks, completion_id, error_body, model_list, sse
from .sampling import SamplingRule
from .session import ProxySession
from .upstream import Upstream

__all__ = ["CaptureProxy"]

log = logging.getLogger(__name__)
_SESSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MAX_BODY = 64 * 2**20  # an agent's whole history comes with every call


class CaptureProxy:
    """The HTTP server and its open sessions (module doc)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port
        self._sessions: dict[str, ProxySession] = {}
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        if self._runner is None:
            raise RuntimeError("the proxy is not started")
        return f"http://{self.host}:{self.port}"

    async def start(self) -> CaptureProxy:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._chat)
        app.router.add_get("/sessions/{sid}/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("capture proxy listening on %s", self.url)
        return self

    async def close(self) -> None:
        for session in list(self._sessions.values()):
            session.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> CaptureProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def session(self, upstream: Upstream, rule: SamplingRule, episode_id: str | None = None) -> ProxySession:
        """Open a session served at ``<url>/sessions/<episode_id or a fresh id>/v1``."""
        session_id = episode_id or uuid.uuid4().hex
        if not _SESSION_ID.match(session_id):
            raise ValueError(f"a session id is 1-128 letters, digits, '.', '_' or '-', not {session_id!r}")
        if session_id in self._sessions:
            raise ValueError(f"session {session_id!r} is already open")
        session = ProxySession(session_id, self.url, upstream, rule, on_close=self._forget)
        self._sessions[session_id] = session
        return session

    def _forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _open(self, request: web.Request) -> ProxySession:
        session = self._sessions.get(request.match_info["sid"])
        if session is None:
            raise _Refusal(404, "not_found_error", f"no open session {request.match_info['sid']!r} on this proxy "
                                                   "(unknown, or its episode has ended)")
        return session

    async def _models(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(model_list(self._open(request).model))
        except _Refusal as refusal:
            return refusal.response()

    async def _unknown(self, request: web.Request) -> web.Response:
        return _Refusal(404, "not_found_error", f"no route {request.method} {request.path}: sessions serve "
                                                "/sessions/<id>/v1/chat/completions and /sessions/<id>/v1/models"
                        ).response()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            session = self._open(request)
            chat = parse_chat_request(await request.read())
            answer = await session.serve(chat)
        except _Refusal as refusal:
            return refusal.response()
        except BadChatRequest as exc:
            return _Refusal(400, "invalid_request_error", str(exc)).response()
        except (ContextOverflowError, EngineRequestError) as exc:
            return _Refusal(400, "invalid_request_error", str(exc)).response()
        except EngineError as exc:
            return _Refusal(502, "upstream_error", f"the engine failed: {exc}").response()
        except Exception as exc:  # noqa: BLE001 - a bug in one call must not take the proxy down
            log.exception("capture proxy: call failed")
            return _Refusal(500, "internal_error", f"{type(exc).__name__}: {exc}").response()
        call_id = completion_id()
        if not chat.stream:
            return web.json_response(chat_completion(answer, session.model, call_id))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for event in chunks(answer, session.model, call_id, chat.include_usage):
            await response.write(sse(event))
        await response.write(sse(None))
        await response.write_eof()
        return response


class _Refusal(Exception):
    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message

    def response(self) -> web.Response:
        body: dict[str, Any] = error_body(self.message, self.kind, self.status)
        return web.Response(status=self.status, text=json.dumps(body), content_type="application/json")
