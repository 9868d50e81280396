"""Scripted demonstrators: text policies (:data:`sao.agents.clients.scripted.TextPolicy`) that solve a task
the way the model should learn to, played through the agent loop by a
:class:`~sao.agents.clients.ScriptedClient`.

``arithmetic_tool`` solves ``arithmetic`` with ``tools="python"`` in two turns: first a Hermes ``python``
tool call that prints the expression (``print(644 * 603)``), then, once the tool's output is in the prompt,
the answer ``\\boxed{N}`` taken from that output (not from the reference: the environment grades it, so a
demonstration is rewarded only when the tool really ran and the answer was read off correctly).
"""

from __future__ import annotations

import json
import re

from sao.agents.clients.scripted import TextPolicy
from sao.hints import did_you_mean

_PROBLEM = re.compile(r"What is (\d+) ([-+*/]) (\d+)\?")
_MARKER = re.compile(r"<\|[^|>]*\|>")  # a chat template's special markers (<|im_start|>, <|im_end|>)
_INTEGER = re.compile(r"-?\d+")
_CALL_END = "</tool_call>"
_PYTHON = {"+": "+", "-": "-", "*": "*", "/": "//"}  # arithmetic's division is exact: integer answers


def arithmetic_tool(prompt: str) -> str:
    """The reply to ``prompt`` (module doc): a tool call while no call was made, else the answer read from
    the tool's output. A prompt without an arithmetic question gets a reply without an answer."""
    questions = list(_PROBLEM.finditer(prompt))
    if not questions:
        return "I cannot find the question."
    question = questions[-1]  # the user's; the tool instructions before it hold a </tool_call> of their own
    rest = prompt[question.end():]
    if _CALL_END not in rest:
        a, op, b = question.groups()
        code = f"print({a} {_PYTHON[op]} {b})"
        return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"
    output = _MARKER.sub(" ", rest[rest.rindex(_CALL_END) + len(_CALL_END):])
    found = _INTEGER.search(output)
    return f"The answer is \\boxed{{{found.group()}}}." if found else "The tool printed no number."


DEMONSTRATORS: dict[str, TextPolicy] = {"arithmetic_tool": arithmetic_tool}
"""``algo.demonstrator``: each name's text policy."""


def demonstrator(name: str) -> TextPolicy:
    """The demonstrator ``name``; an unknown one names the closest known."""
    try:
        return DEMONSTRATORS[name]
    except KeyError:
        raise ValueError(f"unknown demonstrator {name!r} (known: {', '.join(DEMONSTRATORS)})"
                         + did_you_mean(name, list(DEMONSTRATORS), clause=True)) from None
