"""The prompt token ids for an agent's chat request (token upstream), without re-tokenizing what was sampled.

An agent sends its whole history on every call. Rendering that history afresh would re-tokenize the
model's earlier answers, and a re-tokenized answer can differ from the tokens the engine sampled (and a
template that ignores ``tool_calls`` would drop the calls). So when the request's history is an earlier
call's messages, then the reply the proxy gave to it, then new messages (tool results, the next user
turn), the prompt is that call's prompt ids, its sampled ids, and the bridge to the new messages
(:meth:`ChatRenderer.bridge`, as the project's token loop does): it extends the earlier call exactly, and
the calls merge into one segment (:mod:`.segments`). Otherwise (the agent edited, dropped or compacted
its history, or changed its tools) the request is rendered whole, and it starts a new segment.

For a template that does not render ``tools`` (SmolLM2's), an assistant message's tool calls are written
into its text as the Hermes ``<tool_call>`` blocks the project's tool prompt asks for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sao.envs import Message

from ..chat import ChatRenderer
from ..errors import RenderError
from .calls import CapturedCall
from .requests import ChatRequest, same_message

__all__ = ["prompt_ids", "template_messages"]


def prompt_ids(renderer: ChatRenderer, request: ChatRequest, earlier: Sequence[CapturedCall]) -> list[int]:
    """The prompt for ``request``: an earlier call extended (module doc), else the messages rendered whole."""
    for call in reversed(earlier):
        new = _continuation(request, call)
        if new is None:
            continue
        try:
            bridge = renderer.bridge(template_messages(call.messages, renderer.native_tools), call.completion,
                                     template_messages(new, renderer.native_tools))
        except RenderError:
            break  # the template re-renders earlier turns: no exact extension exists
        return [*call.prompt_ids, *call.completion.token_ids, *bridge]  # type: ignore[union-attr]
    return renderer.prompt(template_messages(request.messages, renderer.native_tools))


def _continuation(request: ChatRequest, call: CapturedCall) -> tuple[Message, ...] | None:
    """The messages ``request`` adds after ``call``'s messages and reply, when it repeats them; else None."""
    if call.completion is None or call.reply is None or call.tools != request.tools:
        return None
    n = len(call.messages)
    messages = request.messages
    if len(messages) <= n + 1 or not same_message(messages[n], call.reply):
        return None
    if not all(same_message(a, b) for a, b in zip(messages[:n], call.messages)):
        return None
    return messages[n + 1:]


def template_messages(messages: Sequence[Message], native_tools: bool) -> list[Message]:
    """``messages`` as the chat template takes them: tool-call arguments as objects for a template that
    renders tool calls, or the calls as Hermes text in the content for one that does not."""
    return [_for_template(m, native_tools) if m.get("tool_calls") else m for m in messages]


def _for_template(message: Message, native_tools: bool) -> Message:
    calls = [(c["function"]["name"], _arguments(c["function"].get("arguments"))) for c in message["tool_calls"]]
    if native_tools:
        return dict(message, tool_calls=[{"type": "function", "function": {"name": name, "arguments": args}}
                                         for name, args in calls])
    blocks = "".join(f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"
                     for name, args in calls)
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = (message.get("content") or "") + blocks
    return out


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments if arguments is not None else {}
