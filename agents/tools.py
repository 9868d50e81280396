"""Tool calls out of sampled text (Hermes/Qwen style ``<tool_call>{json}</tool_call>``).

Parsing happens on our side because the engine only sees tokens. A malformed call is not an
exception: it is returned in ``errors`` so that the environment can answer with an observation
that says what was wrong, and the episode goes on.
"""

from __future__ import annotations

import json
import re
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


def assistant_message(text: str, *, tools_offered: bool, turn: int = 0) -> Message:
    """The action for one sampled text: content, plus tool calls when the env offers tools.

    Malformed calls go in ``invalid_tool_calls`` (a list of error strings) for the env to report.
    """
    message: Message = {"role": "assistant", "content": text}
    if tools_offered:
        calls, errors = parse_tool_calls(text, turn=turn)
        if calls:
            message["tool_calls"] = calls
        if errors:
            message["invalid_tool_calls"] = errors
    return message
