"""The capture proxy's answers in OpenAI's wire format: a chat completion, the same as a stream of
``chat.completion.chunk`` events (server-sent events ending with ``data: [DONE]``), the model list, and
the error body.

A streamed answer is sent once the whole completion is in (the token route does not stream): a role
chunk, the content, one chunk per tool call, the finish reason, and the usage when the agent asked for it
(``stream_options.include_usage``). An unchanged client reads it as it reads vLLM's or OpenAI's stream.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from .upstream import UpstreamAnswer

__all__ = ["chat_completion", "chunks", "error_body", "model_list", "sse"]


def _usage(answer: UpstreamAnswer) -> dict[str, int] | None:
    if answer.prompt_tokens is None or answer.completion_tokens is None:
        return None
    return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens}


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def chat_completion(answer: UpstreamAnswer, model: str, call_id: str) -> dict[str, Any]:
    """The non-streamed answer."""
    message = {"role": "assistant", "content": answer.reply.get("content"), "tool_calls": None}
    if answer.reply.get("tool_calls"):
        message["tool_calls"] = answer.reply["tool_calls"]
    body: dict[str, Any] = {"id": call_id, "object": "chat.completion", "created": int(time.time()), "model": model,
                            "choices": [{"index": 0, "message": message, "finish_reason": answer.finish_reason,
                                         "logprobs": None}]}
    usage = _usage(answer)
    if usage is not None:
        body["usage"] = usage
    return body


def chunks(answer: UpstreamAnswer, model: str, call_id: str, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The streamed answer's chunks, in order."""
    head = {"id": call_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    yield chunk({"role": "assistant", "content": ""})
    if answer.reply.get("content"):
        yield chunk({"content": answer.reply["content"]})
    for i, call in enumerate(answer.reply.get("tool_calls") or ()):
        yield chunk({"tool_calls": [{"index": i, "id": call.get("id"), "type": "function",
                                     "function": {"name": call["function"]["name"],
                                                  "arguments": call["function"].get("arguments") or ""}}]})
    yield chunk({}, answer.finish_reason)
    usage = _usage(answer)
    if include_usage and usage is not None:
        yield {**head, "choices": [], "usage": usage}


def sse(event: dict[str, Any] | None) -> bytes:
    """One server-sent event; None: the closing ``[DONE]``."""
    return b"data: [DONE]\n\n" if event is None else b"data: " + json.dumps(event).encode() + b"\n\n"


def model_list(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "sao"}]}


def error_body(message: str, kind: str, status: int) -> dict[str, Any]:
    """OpenAI's error shape (what the SDK turns into its ``APIStatusError`` subclasses)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
