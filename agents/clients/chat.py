"""Text-in/text-out chat completions over the OpenAI API, for endpoints that return no token ids.

Hosted APIs (and any ``/v1/chat/completions`` server) take the messages and the tools as the API
defines them, and answer with text, native ``tool_calls`` and ``usage``. Nothing here needs a
tokenizer. Retries, timeouts and error mapping are :mod:`.transport`'s, as for the token client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..errors import EngineResponseError
from ..records import ChatCompletion
from .completions import SamplingParams
from .transport import TransportClient, weight_version


class ChatClient(Protocol):
    """What the text loop needs from a chat endpoint."""

    async def chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
                   params: SamplingParams) -> ChatCompletion: ...


class OpenAIChatClient(TransportClient):
    """A :class:`ChatClient` for any OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    async def chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
                   params: SamplingParams) -> ChatCompletion:
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "temperature": params.temperature,
                                "top_p": params.top_p}
        if params.max_tokens is not None:  # None: no budget, the server's context bounds the answer
            body["max_tokens"] = params.max_tokens
        if tools:
            body["tools"] = list(tools)
            body["tool_choice"] = "auto"
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        body.update(params.optional_fields())  # only those set: a hosted API may not know top_k
        answer = await self._http.post("/chat/completions", body)
        return replace(parse_chat_completion(answer.data), attempts=answer.attempts)


def parse_chat_completion(response: Any) -> ChatCompletion:
    """Check and convert one ``/v1/chat/completions`` response (an SDK object or a dict)."""
    data = response.model_dump() if hasattr(response, "model_dump") else response
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise EngineResponseError(f"response has no choices[0].message: {str(data)[:300]}") from None
    if not isinstance(message, dict):
        raise EngineResponseError(f"choices[0].message is not an object: {str(message)[:300]}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise EngineResponseError(f"choices[0].message.content is not text: {str(content)[:300]}")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise EngineResponseError(f"choices[0].message.tool_calls is not a list: {str(calls)[:300]}")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return ChatCompletion(
        text=content or "",
        finish_reason=choice.get("finish_reason") or "stop",
        tool_calls=tuple(calls),
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        weight_version=weight_version(data, choice),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
