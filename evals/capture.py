"""The capture proxy of an evaluation whose agent is a plug-in (``--agent NAME``): the agent is pointed at
its own session (``/sessions/<episode>/v1``) of a :class:`~sao.agents.capture.CaptureProxy` in front of the
model's endpoint, and every call is recorded.

On a token endpoint (vLLM) a call is rendered with the project's chat template, tools included, sampled on
token ids and its tool calls parsed with vLLM's parser (:class:`~sao.agents.capture.TokenUpstream`): the
record holds the exact tokens. On a chat endpoint (a hosted API, ``--endpoint-mode chat``) the call is
forwarded (:class:`~sao.agents.capture.TextUpstream`): a text record. The agent's own sampling settings
pass through (:class:`~sao.agents.capture.AgentSampling`; ``--max-tokens-per-turn`` bounds an answer only when
the agent sets no ``max_tokens``); training pins them instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from sao.agents import OpenAIChatClient, Renderers
from sao.agents.capture import AgentSampling, CaptureProxy, CaptureSessions, TextUpstream, TokenUpstream, default_tool_parser
from sao.agents.clients import Endpoint

OpenerFor = Callable[[Any], CaptureSessions]
"""``opener_for(client)``: the session opener of an episode that samples through ``client`` (token mode; its
per-episode client behind a router), or through the endpoint's chat client (text mode: ``client`` unused)."""


@contextlib.asynccontextmanager
async def capturing(endpoint: Endpoint, tokenizer: Any | None, *, tool_parser: str = "hermes",
                    client_args: dict[str, Any] | None = None, max_tokens: int | None = None) -> AsyncIterator[OpenerFor]:
    """A running proxy for the block, as an :data:`OpenerFor`; ``tokenizer`` None: text mode. ``max_tokens``
    (``--max-tokens-per-turn``) bounds a call whose agent sends no ``max_tokens`` (None: the context does)."""
    rule = AgentSampling(max_tokens=max_tokens)
    async with CaptureProxy() as proxy:
        if tokenizer is None:
            chat = OpenAIChatClient(endpoint.base_url, endpoint.model, **(client_args or {}))
            upstream = TextUpstream(chat, endpoint.model)
            try:
                yield lambda _client: CaptureSessions(proxy, upstream, rule)
            finally:
                await chat.aclose()
            return
        renderers, parser = Renderers(tokenizer), default_tool_parser(tokenizer, tool_parser)

        def opener(client: Any) -> CaptureSessions:  # a call without max_tokens gets what the context leaves
            upstream = TokenUpstream(client, renderers, parser, endpoint.model, max_model_len=endpoint.max_model_len)
            return CaptureSessions(proxy, upstream, rule)

        yield opener
