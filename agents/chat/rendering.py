"""Chat templates as token ids, without re-tokenization drift.

The agent loop talks to the engine in tokens. The first prompt is the chat template rendered and
tokenized once. After that, the sequence only ever grows: each turn appends the tokens the engine
*sampled* (never a re-tokenization of their text) and then the *bridge*, the tokens the chat
template puts between that assistant message and the next generation prompt (the end-of-turn
marker when the model did not sample it, the environment's messages, the new assistant header).

The bridge is found by rendering the conversation twice with a sentinel in place of the assistant
text, with and without the new messages, and taking the difference. That works for any template
whose rendering of earlier messages does not depend on later ones (ChatML, Llama 3, Qwen, ...);
:class:`RenderError` says so when a template breaks that rule.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from sao.envs import Message

from ..errors import RenderError
from ..records import Completion

_SENTINEL = "\u2063SAO-ASSISTANT-TURN\u2063"


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer that the loop uses."""

    all_special_ids: list[int]

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class ChatRenderer:
    """Turns chat messages into prompt token ids for one tokenizer and tool set."""

    def __init__(self, tokenizer: Tokenizer, tools: Sequence[dict[str, Any]] = ()):
        self.tokenizer = tokenizer
        self.tools = list(tools)
        self._special = set(tokenizer.all_special_ids)
        # Templates without tool support ignore `tools=`; then the tools are described in the system prompt.
        probe = [{"role": "user", "content": "x"}]
        self.native_tools = bool(self.tools) and self._apply(probe, False, self.tools) != self._apply(probe, False, None)

    def _apply(self, messages: Sequence[Message], add_generation_prompt: bool, tools: Any) -> Any:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template([_as_text(m) for m in messages], **kwargs)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        if self.tools and not self.native_tools:
            messages = _with_tool_prompt(messages, self.tools)
        text = self._apply(messages, add_generation_prompt, self.tools if self.native_tools else None)
        if not isinstance(text, str):
            raise RenderError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the first prompt, ending with the assistant generation header."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def bridge(self, history: Sequence[Message], completion: Completion, new_messages: Sequence[Message]) -> list[int]:
        """Observation tokens that follow ``completion`` (sampled after ``history``) before the next turn."""
        with_turn = [*history, {"role": "assistant", "content": _SENTINEL}]
        prefix = self.render(with_turn, add_generation_prompt=False)
        full = self.render([*with_turn, *new_messages], add_generation_prompt=True)
        if not full.startswith(prefix) or prefix.count(_SENTINEL) != 1:
            raise RenderError("the chat template re-renders earlier messages when new ones are added;"
                              " token-exact multi-turn rollouts need a template that only appends")
        closing = prefix[prefix.index(_SENTINEL) + len(_SENTINEL):]
        ids = completion.token_ids
        if completion.finish_reason == "stop" and ids and ids[-1] in self._special:
            # The model sampled the end-of-turn marker itself; only the rest of the closing is new.
            marker = self.tokenizer.decode([ids[-1]], skip_special_tokens=False)
            if closing.startswith(marker):
                closing = closing[len(marker):]
        return self.encode(closing + full[len(prefix):])


def tool_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """Hermes-style tool instructions, for chat templates that do not render ``tools`` themselves."""
    schemas = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return ("You can call these tools:\n" + schemas + "\n\nTo call a tool, write:\n<tool_call>\n"
            '{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
            "Tool results come back in the next message. When you are done, answer without a tool call.")


def _with_tool_prompt(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> list[Message]:
    prompt = tool_prompt(tools)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{prompt}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def _as_text(message: Message) -> Message:
    """Templates expect string content; a tool-call message may carry None."""
    return message if isinstance(message.get("content"), str) else dict(message, content="")


class ByteTokenizer:
    """A self-contained ChatML tokenizer for tests and the fake server: one token per UTF-8 byte.

    Ids 0-255 are bytes; 256 is ``<|im_start|>`` and 257 is ``<|im_end|>`` (also EOS).
    """

    specials = {"<|im_start|>": 256, "<|im_end|>": 257}
    eos_token = "<|im_end|>"
    eos_token_id = 257
    all_special_ids = [256, 257]

    def apply_chat_template(self, conversation: Any, *, tools: Any = None, add_generation_prompt: bool = False,
                            tokenize: bool = False, **_: Any) -> Any:
        text = ""
        if tools:
            text += "<|im_start|>system\nTools: " + ", ".join(t["function"]["name"] for t in tools) + "<|im_end|>\n"
        for m in conversation:
            text += f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n"
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for marker, tid in self.specials.items():
                if text.startswith(marker, i):
                    ids.append(tid)
                    i += len(marker)
                    break
            else:
                j = min((k for k in (text.find(m, i) for m in self.specials) if k >= 0), default=len(text))
                ids.extend(text[i:j].encode("utf-8"))
                i = j
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in self.specials.items()}
        out, buf = [], bytearray()
        for t in token_ids:
            if t in names:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                if not skip_special_tokens:
                    out.append(names[t])
            elif 0 <= t < 256:
                buf.append(t)
            else:  # an id this tokenizer does not have (a prompt from another tokenizer)
                buf.extend("\ufffd".encode())
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)
