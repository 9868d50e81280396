"""The record of one chat call through the capture proxy: :class:`CapturedCall`.

A session keeps one per call its agent made, in the order the calls came in. A token-mode call (a token
upstream) holds the prompt ids the engine was given and its :class:`~sao.agents.records.Completion` (token
ids, log-probs, per-token versions, the weight version, ``old_kv``); a text-mode call (a hosted chat
endpoint) holds its :class:`~sao.agents.records.ChatCompletion`. A call the upstream failed holds neither,
and says why in ``error``: it is kept (nothing is lost) and left out of the episode's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sao.envs import Message

from ..clients.completions import SamplingParams
from ..records import ChatCompletion, Completion

__all__ = ["CapturedCall"]


@dataclass(frozen=True)
class CapturedCall:
    """One chat call.

    index:      its position in the session (0 first), by arrival.
    messages, tools: what the agent sent (messages checked, their text parts joined).
    requested:  the sampling fields the agent asked for, as sent (``temperature``, ``max_tokens``, ...).
    forwarded:  the settings the upstream was asked with (the session's sampling rule's choice).
    pinned:     the agent's settings the rule overrode (training), by name; empty when none.
    reply:      the assistant message the agent got back (``content``, ``tool_calls``).
    prompt_ids: the rendered prompt the engine was given (token mode).
    completion: what the engine sampled (token mode).
    chat:       what a hosted endpoint answered (text mode).
    t_start, t_end: seconds since the session opened.
    stream:     whether the agent asked for a streamed answer.
    error:      why the upstream failed; None for a served call.
    """

    index: int
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]
    requested: dict[str, Any]
    forwarded: SamplingParams
    pinned: tuple[str, ...]
    reply: Message | None
    prompt_ids: tuple[int, ...] | None = None
    completion: Completion | None = None
    chat: ChatCompletion | None = None
    t_start: float = 0.0
    t_end: float = 0.0
    stream: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        if (self.completion is None) != (self.prompt_ids is None):
            raise ValueError("a token-mode call has both its prompt ids and its completion, other calls neither")
        if self.completion is not None and self.chat is not None:
            raise ValueError("a call is either token mode (completion) or text mode (chat), not both")

    @property
    def served(self) -> bool:
        """Whether the upstream answered it."""
        return self.error is None

    @property
    def mode(self) -> str | None:
        """"tokens", "text", or None for a failed call."""
        return "tokens" if self.completion is not None else "text" if self.chat is not None else None
