"""Tool calls out of a sampled text, as the proxy returns them to an agent: a :class:`ToolCallParser`.

The preferred parser is vLLM's own ``ToolParser`` for the model family (:class:`VLLMToolParser`; "hermes"
for SmolLM2 and Qwen: ``<tool_call>{json}</tool_call>``), run in process on the completion's text, so the
agent gets the calls a vLLM chat route would have given it. Importing vLLM's parsers loads torch (8-11 s
once per process), so the parser is made when the upstream is, not on a request. Where vLLM is not
installed, :func:`default_tool_parser` falls back to the project's own Hermes parser
(:class:`ProjectToolParser`, sao.agents.loop.tools), and logs that it did.
"""

from __future__ import annotations

import importlib.util
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..chat import Tokenizer
from ..loop.tools import parse_tool_calls

__all__ = ["ParsedReply", "ProjectToolParser", "ToolCallParser", "VLLMToolParser", "default_tool_parser"]

log = logging.getLogger(__name__)
TOOL_CALL_START = "<tool_call>"


@dataclass(frozen=True)
class ParsedReply:
    """A completion's text as an assistant message: its ``content`` (None when it was only tool calls) and
    the ``tool_calls`` in OpenAI's shape (``id``, ``type``, ``function.name``, ``function.arguments`` text)."""

    content: str | None
    tool_calls: tuple[dict[str, Any], ...] = ()


class ToolCallParser(Protocol):
    """Finds the tool calls in a completion's text, for the tools the request offered."""

    def parse(self, text: str, tools: Sequence[dict[str, Any]]) -> ParsedReply: ...


class VLLMToolParser:
    """vLLM's ``ToolParser`` registered as ``name`` ("hermes", ...), in process. One parser object per call
    (they keep streaming state); the tokenizer is the model's (some parsers look up their tags in it)."""

    def __init__(self, tokenizer: Tokenizer, name: str = "hermes"):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        self.name = name
        self._tokenizer = tokenizer
        self._parser_class = ToolParserManager.get_tool_parser(name)
        self._request_class = ChatCompletionRequest

    def parse(self, text: str, tools: Sequence[dict[str, Any]]) -> ParsedReply:
        request = self._request_class(model="capture", messages=[{"role": "user", "content": ""}], tools=list(tools))
        found = self._parser_class(self._tokenizer, request.tools).extract_tool_calls(text, request)
        if not found.tools_called:
            return ParsedReply(text)
        calls = tuple({"id": call.id or _call_id(), "type": "function",
                       "function": {"name": call.function.name, "arguments": call.function.arguments}}
                      for call in found.tool_calls)
        return ParsedReply(found.content or None, calls)


class ProjectToolParser:
    """The project's Hermes parser (sao.agents.loop.tools.parse_tool_calls): the fallback without vLLM.
    A malformed call is left in the content as text (vLLM's Hermes parser does the same)."""

    def parse(self, text: str, tools: Sequence[dict[str, Any]]) -> ParsedReply:
        calls, errors = parse_tool_calls(text)
        if not calls or errors:
            return ParsedReply(text)
        content = text[:text.find(TOOL_CALL_START)]
        return ParsedReply(content or None, tuple(dict(c, id=_call_id()) for c in calls))


def default_tool_parser(tokenizer: Tokenizer, name: str = "hermes") -> ToolCallParser:
    """vLLM's parser ``name`` when vLLM is installed, else the project's Hermes parser (logged)."""
    if importlib.util.find_spec("vllm") is not None:
        return VLLMToolParser(tokenizer, name)
    log.warning("vLLM is not installed: tool calls are parsed with the project's Hermes parser, not vLLM's %r", name)
    return ProjectToolParser()


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
