"""One episode's session on the capture proxy: :class:`ProxySession`.

A session pairs an :class:`~.upstream.Upstream` (where calls go) with a :class:`~.sampling.SamplingRule`
(training's pinned settings, or evaluation's pass-through) and keeps the :class:`~.calls.CapturedCall` of
every call its agent made, served or failed, in the order they came in. Its ``base_url`` is what the agent
is given; closing it makes that URL answer 404 and keeps the calls. :meth:`ProxySession.assemble` turns the
calls into the episode's tokens (:mod:`.segments`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..errors import EngineError
from ..external.task import AgentEndpoint
from .calls import CapturedCall
from .requests import ChatRequest
from .sampling import SamplingRule, requested_sampling
from .segments import Assembled, assemble
from .upstream import Upstream, UpstreamAnswer

__all__ = ["ProxySession"]

log = logging.getLogger(__name__)


class ProxySession:
    """An episode's calls through the proxy (module doc). Made by :meth:`CaptureProxy.session`; a context
    manager that closes it."""

    def __init__(self, session_id: str, root_url: str, upstream: Upstream, rule: SamplingRule,
                 on_close: Callable[[str], None]):
        if rule.trains and not upstream.captures_tokens:
            raise ValueError("training needs the sampled token ids, and this upstream (a hosted chat endpoint) "
                             "returns none: train through the token route, or evaluate only")
        self.id = session_id
        self.upstream = upstream
        self.rule = rule
        self.base_url = f"{root_url}/sessions/{session_id}/v1"
        self.api_key = f"sao-{session_id}"  # any key is accepted; this one names the session in logs
        self.closed = False
        self._on_close = on_close
        self._calls: list[CapturedCall] = []
        self._arrived = 0
        self._opened = time.monotonic()

    @property
    def model(self) -> str:
        return self.upstream.model

    @property
    def calls(self) -> tuple[CapturedCall, ...]:
        """Every call so far, served or failed, by arrival."""
        return tuple(sorted(self._calls, key=lambda c: c.index))

    @property
    def n_calls(self) -> int:
        return len(self._calls)

    def endpoint(self) -> AgentEndpoint:
        """What an external agent is given."""
        return AgentEndpoint(self.base_url, self.model, self.api_key)

    def assemble(self) -> Assembled:
        return assemble(self.calls)

    async def serve(self, request: ChatRequest) -> UpstreamAnswer:
        """Answer one call and record it; a failure of the upstream is recorded, then raised."""
        requested = requested_sampling(request.body)
        choice = self.rule.choose(requested)
        index, self._arrived = self._arrived, self._arrived + 1
        t_start = time.monotonic() - self._opened
        earlier = [c for c in self.calls if c.served]

        def record(**fields: object) -> CapturedCall:
            call = CapturedCall(index=index, messages=request.messages, tools=request.tools, requested=requested,
                                forwarded=choice.params, pinned=choice.pinned, t_start=t_start,
                                t_end=time.monotonic() - self._opened, stream=request.stream, **fields)  # type: ignore[arg-type]
            self._calls.append(call)
            return call

        try:
            answer = await self.upstream.answer(request, choice.params, earlier)
        except EngineError as exc:
            record(reply=None, error=f"{type(exc).__name__}: {exc}")
            log.warning("session %s call %d failed: %s", self.id, index, exc)
            raise
        call = record(reply=answer.reply, prompt_ids=answer.prompt_ids, completion=answer.completion, chat=answer.chat)
        log.info("session %s call %d: %s prompt, %s completion tokens, %s%s", self.id, index, answer.prompt_tokens,
                 answer.completion_tokens, answer.finish_reason,
                 f", pinned {', '.join(call.pinned)}" if call.pinned else "")
        return answer

    def close(self) -> None:
        """Stop serving (its URL answers 404); the calls stay."""
        if not self.closed:
            self.closed = True
            self._on_close(self.id)

    def __enter__(self) -> ProxySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
