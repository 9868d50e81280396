"""The text agent loop: one episode against a chat endpoint that returns no token ids.

    messages = first observation
    repeat up to max_turns:
        reply = chat(messages, tools)                          # text, native tool calls, usage
        obs, reward, terminated, truncated, info = env.step(assistant message)
        if the episode ended: stop
        messages += assistant message + obs

It is :func:`~sao.agents.loop.token_loop.run_episode` without tokens: the same :class:`~sao.agents.loop.token_loop.LoopConfig`,
the same end conditions and the same failure record, and a :class:`~sao.agents.records.Trajectory`
with ``mode="text"`` (no token ids, not trainable). Native tool calls keep their ids; without them,
Hermes ``<tool_call>`` text is parsed as in the token loop.

The ``max_tokens`` budget is counted from the API's ``usage.completion_tokens``; for a reply
without usage, from an estimate of 4 characters per token (text plus tool-call arguments), or the
whole request's ``max_tokens`` when the reply ended with ``finish_reason == "length"``. As in the
token loop, a reply cut by ``length`` still goes to the environment; if that ends the episode (the
environment graded it), it is recorded both terminated and truncated (``truncated_by`` names the limit),
and if not, the budget ends the episode (truncated, ``truncated_by="max_tokens"``) at the next turn.
``max_model_len`` is not used here (a hosted model's context is not known): a server that reports a
context overflow ends the episode as truncated (``truncated_by="context"``).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

import gymnasium as gym

from ..chat import api_messages
from ..clients import ChatClient, SamplingParams
from ..errors import ContextOverflowError
from ..records import ChatCompletion, Trajectory, TurnRecord, jsonable
from .env_calls import failure_of, reset_env, step_env
from .token_loop import LoopConfig, final_info, length_cut, turn_seed
from .tools import assistant_message

CHARS_PER_TOKEN = 4  # the budget's estimate for replies without usage


async def run_text_episode(
    env: gym.Env,
    client: ChatClient,
    cfg: LoopConfig,
    *,
    env_name: str,
    task_id: str,
    sample: int = 0,
    seed: int | None = None,
    episode_id: str | None = None,
) -> Trajectory:
    """Run one episode to its end; always returns a :class:`Trajectory` (failures included)."""
    t0 = time.monotonic()
    turns: list[TurnRecord] = []
    transcript: list[dict[str, Any]] = []  # what the env saw; the API's view is api_messages(transcript)
    reward, terminated, truncated = 0.0, False, False
    info: dict[str, Any] = {}
    status, error, failure, truncated_by = "ok", None, None, None
    tools = list(getattr(env.unwrapped, "tools", ()))
    per_turn = cfg.max_tokens_per_turn or cfg.max_tokens
    generated = 0
    try:
        obs, info = await reset_env(env, seed=seed, options={"task_id": task_id})
        transcript += obs
        for turn in range(cfg.max_turns):
            budget_left = cfg.max_tokens - generated
            room = min(per_turn, budget_left)
            if room <= 0:
                truncated_by = "max_tokens"
                break
            params = SamplingParams(max_tokens=room, temperature=cfg.temperature, top_p=cfg.top_p,
                                    seed=turn_seed(seed, turn))
            t_start = time.monotonic() - t0
            try:
                reply = await client.chat(api_messages(transcript), tools, params)
            except ContextOverflowError:
                truncated_by = "context"
                break
            turns.append(TurnRecord(0, 0, reply.finish_reason, reply.weight_version, t_start, time.monotonic() - t0,
                                    reply.attempts,
                                    prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens))
            generated += spent_tokens(reply, room)
            action = assistant_message(reply.text, tools_offered=bool(tools), turn=turn, native_calls=reply.tool_calls)
            obs, r, terminated, truncated, info = await step_env(env, action)
            reward += r
            transcript += [action, *obs]
            if terminated or truncated:
                if terminated and reply.finish_reason == "length":  # graded, but a limit cut the answer
                    truncated_by = length_cut(cfg, budget_left=budget_left)
                break
        else:
            truncated_by = "max_turns"
    except Exception as exc:  # noqa: BLE001 - a bad rollout is data: record the cause, keep the run going
        status, error, failure = "failed", f"{type(exc).__name__}: {exc}", failure_of(exc)
    info = final_info(info, status=status, error=error, truncated_by=truncated_by)
    return Trajectory(
        episode_id=episode_id or uuid.uuid4().hex,
        env=env_name,
        task_id=task_id,
        sample=sample,
        seed=seed,
        token_ids=(),
        action_mask=(),
        logprobs=(),
        turns=tuple(turns),
        messages=tuple(transcript),
        reward=reward,
        terminated=terminated and status == "ok",
        truncated=truncated or truncated_by is not None,
        status=status,
        error=error,
        info=jsonable(info),
        wall_s=time.monotonic() - t0,
        mode="text",
        failure=failure,
    )


def spent_tokens(reply: ChatCompletion, requested: int) -> int:
    """Tokens one reply takes from the budget (see the module docstring)."""
    if reply.completion_tokens is not None:
        return reply.completion_tokens
    if reply.finish_reason == "length":
        return requested
    chars = len(reply.text) + sum(len(json.dumps(c, default=str)) for c in reply.tool_calls)
    return min(requested, max(1, math.ceil(chars / CHARS_PER_TOKEN)))
