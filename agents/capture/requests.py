"""One chat request as an agent sent it to the capture proxy, checked: :class:`ChatRequest`, made by
:func:`parse_chat_request` from the JSON body of ``POST .../chat/completions``.

A body the proxy cannot serve raises :class:`BadChatRequest`, which the proxy answers with HTTP 400 and
the message (OpenAI's error shape), never a crash: not a JSON object, no ``messages`` list, a message
without a role, content that is not text (images), ``tools`` that are not function schemas, ``n`` other
than 1, a non-boolean ``stream``. The sampling fields are left in ``body`` for the sampling rule
(:mod:`.sampling`) to read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sao.envs import Message

__all__ = ["BadChatRequest", "ChatRequest", "parse_chat_request", "same_message"]


class BadChatRequest(ValueError):
    """A request body the proxy cannot serve; its message says what is wrong (HTTP 400)."""


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request. ``messages`` have text ``content`` (a list of text parts is joined; None
    stays None for an assistant message with tool calls); ``body`` is the whole JSON body as sent."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    model: str | None = None
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def calls_tools(self) -> bool:
        """Whether tool calls are to be parsed out of the answer (tools offered, and not turned off)."""
        return bool(self.tools) and self.tool_choice != "none"


def parse_chat_request(raw: bytes) -> ChatRequest:
    """The checked request in ``raw`` (a JSON body), or :class:`BadChatRequest`."""
    try:
        body = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadChatRequest(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadChatRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadChatRequest("'messages' must be a non-empty list of chat messages")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(_is_function(t) for t in tools):
        raise BadChatRequest("'tools' must be a list of {\"type\": \"function\", \"function\": {\"name\": ...}}")
    if body.get("n", 1) != 1:
        raise BadChatRequest(f"'n' must be 1 (one choice per call is captured), not {body.get('n')!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadChatRequest(f"'stream' must be true or false, not {stream!r}")
    options = body.get("stream_options") or {}
    return ChatRequest(messages=tuple(_message(i, m) for i, m in enumerate(messages)), tools=tuple(tools),
                       tool_choice=body.get("tool_choice"), stream=stream,
                       include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
                       model=body.get("model") if isinstance(body.get("model"), str) else None, body=body)


def _is_function(tool: Any) -> bool:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str)


def _message(index: int, message: Any) -> Message:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadChatRequest(f"messages[{index}] must be an object with a 'role'")
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None for p in content]
        if any(not isinstance(t, str) for t in texts):
            raise BadChatRequest(f"messages[{index}].content: only text parts are served (no images or audio)")
        content = "".join(texts)  # type: ignore[arg-type]
    elif content is not None and not isinstance(content, str):
        raise BadChatRequest(f"messages[{index}].content must be text, a list of text parts, or null")
    calls = message.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or not all(_is_call(c) for c in calls)):
        raise BadChatRequest(f"messages[{index}].tool_calls must be a list of {{'function': {{'name', 'arguments'}}}}")
    out: Message = {k: v for k, v in message.items() if v is not None or k == "content"}
    out["content"] = content
    return out


def _is_call(call: Any) -> bool:
    fn = call.get("function") if isinstance(call, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str)


def same_message(a: Message, b: Message) -> bool:
    """Whether two messages say the same to a model: role, text (None as ""), name and tool calls (name and
    arguments as parsed JSON). An SDK's echo of the proxy's answer adds fields (``refusal``, ``audio``,
    ids) that do not count."""
    return _key(a) == _key(b)


def _key(m: Message) -> tuple[Any, ...]:
    calls = tuple((c["function"]["name"], _args(c["function"].get("arguments"))) for c in m.get("tool_calls") or ())
    return m.get("role"), m.get("content") or "", m.get("name"), m.get("tool_call_id"), calls


def _args(arguments: Any) -> str:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return str(arguments)
    return json.dumps(value, sort_keys=True)
