"""Where the capture proxy sends a chat call: an :class:`Upstream`.

* :class:`TokenUpstream` (the preferred design; training and evaluation): the proxy renders the chat with
  the project's :class:`~sao.agents.chat.ChatRenderer` (tools included: the Hermes tool prompt for a
  template that ignores ``tools``; one renderer per tool set, :class:`~sao.agents.loop.episodes.Renderers`),
  builds the prompt ids without re-tokenizing earlier answers (:mod:`.prompts`), samples with a
  :class:`~sao.agents.clients.CompletionClient` (the token route gives per-token policy versions; in
  training the rollout passes its per-episode versioned client), and parses tool calls out of the text
  with vLLM's parser (:mod:`.tool_calls`). A call that sets no ``max_tokens`` gets what the context
  (``max_model_len``) leaves after its prompt, as on a chat route; a completions route would stop it at 16.
* :class:`TextUpstream` (evaluation only): a hosted chat endpoint that returns no token ids; the call
  goes to its ``/chat/completions`` as sent (:class:`~sao.agents.clients.chat.OpenAIChatClient`) and is
  recorded as text.

Either answers with an :class:`UpstreamAnswer`; engine failures are :class:`~sao.agents.errors.EngineError`
s, which the proxy answers as HTTP errors and records as failed calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

from sao.envs import Message

from ..clients.chat import ChatClient
from ..clients.completions import CompletionClient, SamplingParams
from ..errors import ContextOverflowError
from ..loop.episodes import RendererFor
from ..records import ChatCompletion, Completion
from .calls import CapturedCall
from .prompts import prompt_ids
from .requests import ChatRequest
from .tool_calls import ParsedReply, ToolCallParser

__all__ = ["TextUpstream", "TokenUpstream", "Upstream", "UpstreamAnswer"]


@dataclass(frozen=True)
class UpstreamAnswer:
    """One call's answer: the assistant ``reply`` for the agent, its ``finish_reason``, the token counts
    for ``usage`` (None where unknown), and what was captured (token mode: ``prompt_ids`` and
    ``completion``; text mode: ``chat``)."""

    reply: Message
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    prompt_ids: tuple[int, ...] | None = None
    completion: Completion | None = None
    chat: ChatCompletion | None = None


class Upstream(Protocol):
    """Answers one chat request; ``earlier`` are the session's calls so far (the token upstream extends them)."""

    model: str
    captures_tokens: ClassVar[bool]  # whether its calls carry token ids (training needs them)

    async def answer(self, request: ChatRequest, params: SamplingParams,
                     earlier: Sequence[CapturedCall]) -> UpstreamAnswer: ...


class TokenUpstream:
    """Render, sample on token ids, parse tool calls (module doc)."""

    captures_tokens: ClassVar[bool] = True

    def __init__(self, client: CompletionClient, renderers: RendererFor, tool_parser: ToolCallParser, model: str,
                 *, max_model_len: int | None = None):
        self.client = client
        self.renderers = renderers
        self.tool_parser = tool_parser
        self.model = model
        self.max_model_len = max_model_len

    async def answer(self, request: ChatRequest, params: SamplingParams,
                     earlier: Sequence[CapturedCall]) -> UpstreamAnswer:
        renderer = self.renderers(request.tools)
        prompt = prompt_ids(renderer, request, earlier)
        completion = await self.client.complete(prompt, self.bounded(params, len(prompt)))
        parsed = (self.tool_parser.parse(completion.text, request.tools) if request.calls_tools
                  else ParsedReply(completion.text))
        finish = completion.finish_reason
        if parsed.tool_calls and finish == "stop":
            finish = "tool_calls"
        reply: Message = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            reply["tool_calls"] = list(parsed.tool_calls)
        return UpstreamAnswer(reply, finish, len(prompt), len(completion.token_ids), prompt_ids=tuple(prompt),
                              completion=completion)

    def bounded(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """``params`` with a ``max_tokens``: the call's own, else what the context leaves after the prompt, as a
        chat route fills it (a completions route left without one answers 16 tokens, vLLM's default);
        :class:`~sao.agents.errors.ContextOverflowError` when the prompt leaves no room. Without a known
        ``max_model_len``, unchanged."""
        if params.max_tokens is not None or self.max_model_len is None:
            return params
        room = self.max_model_len - prompt_len
        if room < 1:
            raise ContextOverflowError(f"This model's maximum context length is {self.max_model_len} tokens; the "
                                       f"prompt is {prompt_len} tokens, which leaves no room for an answer")
        return replace(params, max_tokens=room)


class TextUpstream:
    """Forward to a hosted chat endpoint and record text (module doc); not trainable."""

    captures_tokens: ClassVar[bool] = False

    def __init__(self, client: ChatClient, model: str):
        self.client = client
        self.model = model

    async def answer(self, request: ChatRequest, params: SamplingParams,
                     earlier: Sequence[CapturedCall]) -> UpstreamAnswer:
        chat = await self.client.chat(request.messages, request.tools, params)
        reply: Message = {"role": "assistant", "content": chat.text if chat.text or not chat.tool_calls else None}
        if chat.tool_calls:
            reply["tool_calls"] = list(chat.tool_calls)
        return UpstreamAnswer(reply, chat.finish_reason, chat.prompt_tokens, chat.completion_tokens, chat=chat)
