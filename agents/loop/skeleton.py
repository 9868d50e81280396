"""The episode skeleton every agent loop shares; a :class:`TurnSampler` is the part that differs.

    obs, info = env.reset(seed, task_id);  sampler.observe(obs)
    repeat up to max_turns:
        room = min(per-turn cap, budget left, context left)    # none left: truncated; no budget: the context
        reply = sampler.sample(messages so far, room)           # a context overflow: truncated
        obs, reward, terminated, truncated, info = env.step(assistant message of reply)
        if the episode ended: stop
        sampler.observe(obs)
    a limit cut it and env offers finish_cut: reward, info = env.finish_cut(limit)   # graded: final
    Trajectory(transcript, turns, reward, flags, info, failure, sampler.sampled())

The skeleton owns the limits, the environment calls, the bookkeeping of termination and truncation
(``info["truncated_by"]``), the exit status (``info["exit_status"]``, :mod:`.exits`) and the failure
record: what :mod:`.token_loop` documents for both loops.
A sampler owns how one turn is sampled and how the model is shown what came back: token ids and
log-probs through the chat renderer (:mod:`.token_loop`), text through a chat API with native tool
calls (:mod:`.text_loop`), or whatever serves an external agent's model calls. Nothing here assumes
token ids: a sampler that has none says ``context_left() -> None`` and returns an empty
:class:`Sampled`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import gymnasium as gym

from sao.envs import Message

from ..clients import SamplingParams
from ..errors import ContextOverflowError
from ..records import Trajectory, TurnRecord, jsonable
from .env_calls import failure_of, finish_cut_env, reset_env, step_env
from .exits import with_exit_status
from .seeds import turn_seed
from .tools import assistant_message

if TYPE_CHECKING:
    from typing_extensions import Required, Unpack


@dataclass(frozen=True)
class LoopConfig:
    max_turns: int = 8
    max_tokens: int | None = 1024  # generated tokens per trajectory, all turns together; None: no budget
    max_tokens_per_turn: int | None = None  # None: whatever is left of max_tokens (and of the context)
    max_model_len: int = 4096  # the engine's context window
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_tokens", "max_tokens_per_turn"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")


Clock = Callable[[], float]  # seconds since the episode started


@dataclass(frozen=True)
class Reply:
    """One sampled assistant turn, as the skeleton needs it.

    text:       what the model wrote (tool calls are parsed out of it when there are no native ones).
    tool_calls: a chat API's native tool calls (OpenAI format, unchecked); () when it has none.
    spent:      the tokens it takes from the episode's ``max_tokens`` budget.
    record:     its :class:`TurnRecord` (the sampler's view: token positions or API usage).
    """

    text: str
    finish_reason: str  # "stop" | "length" | "tool_calls" | ...
    spent: int
    record: TurnRecord
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Sampled:
    """What the trajectory keeps of the sampler: its token sequence, empty where it has none (text mode).
    Shapes: ``T`` tokens each, as in :class:`Trajectory`."""

    token_ids: tuple[int, ...] = ()
    action_mask: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    mode: str = "text"  # Trajectory.mode: "tokens" when the three arrays are exact


class TurnSampler(Protocol):
    """How one episode's turns are sampled and shown to the model (module doc)."""

    def observe(self, obs: list[Message]) -> None:
        """The environment's observation: the first (after reset), then each after a step that did not end
        the episode (following the last :meth:`sample`)."""

    def context_left(self) -> int | None:
        """Tokens the model's context still holds; None where it is not known."""

    async def sample(self, messages: Sequence[Message], params: SamplingParams, clock: Clock) -> Reply:
        """The next turn. ``messages`` is what the environment saw so far (assistant turns as parsed
        actions; the skeleton's own list, to read during the call, not to keep); ``clock()`` gives the
        seconds since the episode started, for the record's times. Raises :class:`ContextOverflowError`
        when the prompt does not fit."""

    def sampled(self) -> Sampled:
        """The episode's tokens, for its trajectory."""


@dataclass
class _Progress:
    """What one episode has recorded so far; each field changes only once its call returned."""

    turns: list[TurnRecord] = field(default_factory=list)
    transcript: list[Message] = field(default_factory=list)  # what the env saw (assistant turns as actions)
    info: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    truncated_by: str | None = None
    generated: int = 0


async def _play(env: gym.Env, sampler: TurnSampler, cfg: LoopConfig, ep: _Progress, *, task_id: str,
                seed: int | None, clock: Clock) -> None:
    """Reset, then turns until the episode ends or a limit cuts it; ``ep`` records as it goes."""
    tools_offered = bool(getattr(env.unwrapped, "tools", ()))
    obs, ep.info = await reset_env(env, seed=seed, options={"task_id": task_id})
    ep.transcript += obs
    sampler.observe(obs)
    per_turn = cfg.max_tokens_per_turn or cfg.max_tokens
    for turn in range(cfg.max_turns):
        budget_left = None if cfg.max_tokens is None else cfg.max_tokens - ep.generated
        context_left = sampler.context_left()
        room = smallest(per_turn, budget_left, context_left)
        if room is not None and room <= 0:
            ep.truncated_by = "max_tokens" if budget_left is not None and budget_left <= 0 else "context"
            return
        params = SamplingParams(max_tokens=room, temperature=cfg.temperature, top_p=cfg.top_p,
                                seed=turn_seed(seed, turn))
        try:
            reply = await sampler.sample(ep.transcript, params, clock)
        except ContextOverflowError:
            ep.truncated_by = "context"
            return
        ep.turns.append(reply.record)
        ep.generated += reply.spent
        action = assistant_message(reply.text, tools_offered=tools_offered, turn=turn, native_calls=reply.tool_calls)
        obs, r, ep.terminated, ep.truncated, ep.info = await step_env(env, action)
        ep.reward += r
        ep.transcript += [action, *obs]
        if ep.terminated or ep.truncated:
            if ep.terminated and reply.finish_reason == "length":  # graded, but a limit cut the answer
                ep.truncated_by = length_cut(cfg, budget_left=budget_left, context_left=context_left)
            return
        sampler.observe(obs)
    ep.truncated_by = "max_turns"


async def _finish_cut(env: gym.Env, ep: _Progress) -> None:
    """A loop limit cut the episode before the environment ended it: an environment that offers
    :class:`~sao.envs.capabilities.CutGrading` ends it now (SWE: the diff graded), and its reward is
    final (``terminated`` and ``truncated``); any other stays unfinished (``truncated`` alone)."""
    if ep.truncated_by is None or ep.terminated or ep.truncated:
        return
    finished = await finish_cut_env(env, ep.truncated_by)
    if finished is not None:
        r, ep.info = finished
        ep.reward += r
        ep.terminated = ep.truncated = True


class EpisodeArgs(TypedDict, total=False):
    """Which episode a loop plays, as its keyword arguments (``**episode: Unpack[EpisodeArgs]``);
    :func:`run_turns` gives their defaults."""

    env_name: Required[str]
    task_id: Required[str]
    sample: int  # which sample of the task (0, 1, ... for pass@k)
    seed: int | None  # the environment's reset seed; each turn's sampling seed derives from it
    episode_id: str | None  # None: a fresh one


async def run_turns(env: gym.Env, sampler: TurnSampler, cfg: LoopConfig, *, env_name: str, task_id: str,
                    sample: int = 0, seed: int | None = None, episode_id: str | None = None) -> Trajectory:
    """Run one episode to its end with ``sampler``; always returns a :class:`Trajectory` (failures included)."""
    t0 = time.monotonic()
    ep = _Progress()
    status, error, failure = "ok", None, None
    try:
        await _play(env, sampler, cfg, ep, task_id=task_id, seed=seed, clock=lambda: time.monotonic() - t0)
        await _finish_cut(env, ep)
    except Exception as exc:  # noqa: BLE001 - a bad rollout is data: record the cause, keep the run going
        status, error, failure = "failed", f"{type(exc).__name__}: {exc}", failure_of(exc)
    info = with_exit_status(final_info(ep.info, status=status, error=error, truncated_by=ep.truncated_by),
                            status=status, failure=failure, truncated_by=ep.truncated_by,
                            terminated=ep.terminated, truncated=ep.truncated)
    tokens = sampler.sampled()
    return Trajectory(
        episode_id=episode_id or uuid.uuid4().hex,
        env=env_name,
        task_id=task_id,
        sample=sample,
        seed=seed,
        token_ids=tokens.token_ids,
        action_mask=tokens.action_mask,
        logprobs=tokens.logprobs,
        turns=tuple(ep.turns),
        messages=tuple(ep.transcript),
        reward=ep.reward,
        terminated=ep.terminated and status == "ok",
        truncated=ep.truncated or ep.truncated_by is not None,
        status=status,
        error=error,
        info=jsonable(info),
        wall_s=time.monotonic() - t0,
        mode=tokens.mode,
        failure=failure,
    )


def smallest(*limits: int | None) -> int | None:
    """The tightest of a turn's limits (per-turn cap, budget left, context left); None where none is
    known (no budget, no cap, a context the sampler cannot count): the server's own context bounds it."""
    known = [n for n in limits if n is not None]
    return min(known) if known else None


def length_cut(cfg: LoopConfig, *, budget_left: int | None, context_left: int | None = None) -> str:
    """The limit that cut a turn which ended at its ``max_tokens`` (``finish_reason == "length"``): the
    smallest of the episode's budget left, the per-turn cap and the context left (the budget on a tie);
    the context when none of them is known."""
    room = {} if budget_left is None else {"max_tokens": budget_left}
    if cfg.max_tokens_per_turn is not None:
        room["max_tokens_per_turn"] = cfg.max_tokens_per_turn
    if context_left is not None:
        room["context"] = context_left
    return min(room, key=room.__getitem__) if room else "context"


def final_info(info: dict[str, Any], *, status: str, error: str | None, truncated_by: str | None) -> dict[str, Any]:
    """The episode's last ``info``: ``truncated_by`` when a loop limit cut it, and the final keys the
    environment could not set (``correct`` False, ``answer`` None, ``error``) when it failed or was cut."""
    if truncated_by is not None:
        info = {**info, "truncated_by": truncated_by}
    if status == "failed" or truncated_by is not None:
        info = {"correct": False, "answer": None, **info, "error": error or info.get("error")}
    return info
