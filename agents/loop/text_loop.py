"""The text agent loop: one episode against a chat endpoint that returns no token ids.

    messages = first observation
    repeat up to max_turns:
        reply = chat(messages, tools)                          # text, native tool calls, usage
        obs, reward, terminated, truncated, info = env.step(assistant message)
        if the episode ended: stop
        messages += assistant message + obs

It is :func:`~sao.agents.loop.token_loop.run_episode` without tokens: the same :mod:`.skeleton` (the same
:class:`~sao.agents.loop.skeleton.LoopConfig`, end conditions and failure record) with a :class:`ChatSampler`,
and a :class:`~sao.agents.records.Trajectory` with ``mode="text"`` (no token ids, not trainable). Native
tool calls keep their ids; without them, Hermes ``<tool_call>`` text is parsed as in the token loop.

The ``max_tokens`` budget is counted from the API's ``usage.completion_tokens``; for a reply
without usage, from an estimate of 4 characters per token (text plus tool-call arguments), or the
whole request's ``max_tokens`` when the reply ended with ``finish_reason == "length"``. As in the
token loop, a reply cut by ``length`` still goes to the environment; if that ends the episode (the
environment graded it), it is recorded both terminated and truncated (``truncated_by`` names the limit),
and if not, the budget ends the episode (truncated, ``truncated_by="max_tokens"``) at the next turn.
``max_model_len`` is not used here (a hosted model's context is not known): a server that reports a
context overflow ends the episode as truncated (``truncated_by="context"``). With no budget and no
per-turn cap (``max_tokens=None``), a request names no ``max_tokens``: the server's context bounds it. An episode a limit cut is
finished by an environment that offers :class:`~sao.envs.capabilities.CutGrading`, as in the token loop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from sao.envs import Message

from ..chat import api_messages
from ..clients import ChatClient, SamplingParams
from ..records import ChatCompletion, Trajectory, TurnRecord
from .skeleton import Clock, EpisodeArgs, LoopConfig, Reply, Sampled, run_turns

if TYPE_CHECKING:
    from typing_extensions import Unpack

CHARS_PER_TOKEN = 4  # the budget's estimate for replies without usage


class ChatSampler:
    """A :class:`~.skeleton.TurnSampler` on a chat endpoint: the transcript goes out as API messages with
    the environment's tools; no tokens are kept and the context left is not known."""

    def __init__(self, client: ChatClient, tools: Sequence[dict[str, Any]]) -> None:
        self.client, self.tools = client, list(tools)

    def observe(self, obs: list[Message]) -> None:
        """Nothing to do: the next request is the transcript, which holds ``obs``."""

    def context_left(self) -> None:
        return None

    async def sample(self, messages: Sequence[Message], params: SamplingParams, clock: Clock) -> Reply:
        t_start = clock()
        reply = await self.client.chat(api_messages(messages), self.tools, params)
        record = TurnRecord(0, 0, reply.finish_reason, reply.weight_version, t_start, clock(), reply.attempts,
                            prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
        return Reply(reply.text, reply.finish_reason, spent_tokens(reply, params.max_tokens), record,
                     tool_calls=reply.tool_calls)

    def sampled(self) -> Sampled:
        return Sampled()


async def run_text_episode(env: gym.Env, client: ChatClient, cfg: LoopConfig,
                           **episode: Unpack[EpisodeArgs]) -> Trajectory:
    """Run one episode to its end; always returns a :class:`Trajectory` (failures included). ``episode``:
    as for :func:`~.token_loop.run_episode`."""
    return await run_turns(env, ChatSampler(client, getattr(env.unwrapped, "tools", ())), cfg, **episode)


def spent_tokens(reply: ChatCompletion, requested: int | None) -> int:
    """Tokens one reply takes from the budget (see the module docstring); ``requested`` None: the
    request named no ``max_tokens`` (no budget), and only the estimate counts."""
    if reply.completion_tokens is not None:
        return reply.completion_tokens
    if reply.finish_reason == "length" and requested is not None:
        return requested
    chars = len(reply.text) + sum(len(json.dumps(c, default=str)) for c in reply.tool_calls)
    estimate = max(1, math.ceil(chars / CHARS_PER_TOKEN))
    return estimate if requested is None else min(requested, estimate)
