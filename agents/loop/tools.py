"""Tool calls out of sampled text (Hermes/Qwen style ``<tool_call>{json}</tool_call>``), or checked
from a chat API's native ``tool_calls``.

Parsing happens on our side because the engine only sees tokens. A malformed call is not an
exception: it is returned in ``errors`` so that the environment can answer with an observation
that says what was wrong, and the episode goes on. Native calls (text mode) get the same checks:
a name, and arguments that are a JSON object; their ids are kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from sao.envs import Message

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str, *, turn: int = 0) -> tuple[list[dict[str, Any]], list[str]]:
    """Return (OpenAI-style tool calls, error messages) found in ``text``."""
    calls, errors = [], []
    for i, match in enumerate(_CALL.finditer(text)):
        body = match.group(1)
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {i + 1} is not valid JSON ({exc.msg} at char {exc.pos}): {body[:200]}")
            continue
        name = obj.get("name") if isinstance(obj, dict) else None
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name:
            errors.append(f"tool call {i + 1} has no \"name\": {body[:200]}")
            continue
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                errors.append(f"tool call {i + 1} ({name}): \"arguments\" is a string that is not JSON")
                continue
        if not isinstance(args, dict):
            errors.append(f"tool call {i + 1} ({name}): \"arguments\" must be a JSON object")
            continue
        calls.append({"id": f"call_{turn}_{i}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    return calls, errors


def check_native_tool_calls(raw: Sequence[Any], *, turn: int = 0) -> tuple[list[dict[str, Any]], list[str]]:
    """Return (OpenAI-style tool calls, error messages) for the ``tool_calls`` a chat API returned.

    Ids are preserved (one is made up when missing); ``arguments`` must be a JSON object, sent as a
    string (an empty string means no arguments; an object sent unencoded is accepted and encoded).
    """
    calls, errors = [], []
    for i, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            errors.append(f"tool call {i + 1} has no function name: {json.dumps(call, default=str)[:200]}")
            continue
        args = fn.get("arguments")
        text = args if isinstance(args, str) else json.dumps(args if args is not None else {}, ensure_ascii=False)
        try:
            obj = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {i + 1} ({name}): \"arguments\" is not valid JSON "
                          f"({exc.msg} at char {exc.pos}): {text[:200]}")
            continue
        if not isinstance(obj, dict):
            errors.append(f"tool call {i + 1} ({name}): \"arguments\" must be a JSON object: {text[:200]}")
            continue
        given = call.get("id")
        call_id = given if isinstance(given, str) and given else f"call_{turn}_{i}"
        calls.append({"id": call_id, "type": "function",
                      "function": {"name": name, "arguments": text if text.strip() else "{}"}})
    return calls, errors


def assistant_message(text: str, *, tools_offered: bool, turn: int = 0,
                      native_calls: Sequence[Any] = ()) -> Message:
    """The action for one sampled text: content, plus tool calls when the env offers tools.

    ``native_calls`` (a chat API's ``tool_calls``), when there are any, are the calls; otherwise the
    calls are parsed out of ``text``. Malformed calls go in ``invalid_tool_calls`` (a list of error
    strings) for the env to report.
    """
    message: Message = {"role": "assistant", "content": text}
    if tools_offered:
        if native_calls:
            calls, errors = check_native_tool_calls(native_calls, turn=turn)
        else:
            calls, errors = parse_tool_calls(text, turn=turn)
        if calls:
            message["tool_calls"] = calls
        if errors:
            message["invalid_tool_calls"] = errors
    return message
