"""The episode's transcript as a chat API accepts it (text mode).

The transcript is what the environment saw and said: assistant actions with checked
``tool_calls`` (plus ``invalid_tool_calls``, error strings for the env), and observations that may
hold ``tool`` messages with or without a ``tool_call_id``, in the env's order. The OpenAI chat API
is stricter: an assistant message with ``tool_calls`` must be followed at once by one ``tool``
message per call id, and a ``tool`` message must answer such a call. So, per assistant turn:

* the assistant message keeps ``content`` and its valid ``tool_calls`` (OpenAI fields only);
* the ``tool`` messages that answer its calls come first, in the calls' order; a call the env did
  not answer gets a ``tool`` message saying so;
* every other observation follows: a ``tool`` message answering no call of that turn (an env's
  report of a malformed call, say) becomes a ``user`` message with the same content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sao.envs import Message

NO_RESULT = "(the environment returned no result for this call)"


def api_messages(transcript: Sequence[Message]) -> list[dict[str, Any]]:
    """``transcript`` in the form ``/v1/chat/completions`` accepts (see the module docstring)."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(transcript):
        m = transcript[i]
        i += 1
        if m.get("role") != "assistant":
            out.append(_plain(m))
            continue
        calls = [_call(c) for c in m.get("tool_calls") or ()]
        content = m.get("content") or ""
        out.append({"role": "assistant", "content": content or None, "tool_calls": calls} if calls
                   else {"role": "assistant", "content": content})
        observed = []
        while i < len(transcript) and transcript[i].get("role") != "assistant":
            observed.append(transcript[i])
            i += 1
        answers = {o.get("tool_call_id"): o for o in observed if o.get("role") == "tool" and o.get("tool_call_id")}
        ids = [c["id"] for c in calls]
        out += [{"role": "tool", "tool_call_id": cid,
                 "content": _text(answers[cid]) if cid in answers else NO_RESULT} for cid in ids]
        out += [_plain(o) for o in observed if not (o.get("role") == "tool" and o.get("tool_call_id") in ids)]
    return out


def _plain(m: Message) -> dict[str, Any]:
    role = m.get("role")
    return {"role": role if role in ("system", "user", "assistant") else "user", "content": _text(m)}


def _call(c: dict[str, Any]) -> dict[str, Any]:
    fn = c["function"]
    return {"id": c["id"], "type": "function", "function": {"name": fn["name"], "arguments": fn["arguments"]}}


def _text(m: Message) -> str:
    content = m.get("content")
    return content if isinstance(content, str) else ""
