"""The agent loop: one episode of a text environment against a token-in/token-out engine.

    prompt = render(first observation)
    repeat up to max_turns:
        completion = engine(prompt tokens)                     # action tokens, log-probs
        obs, reward, terminated, truncated, info = env.step(assistant message)
        if the episode ended: stop
        prompt += completion tokens + bridge(obs)             # observation tokens

Limits end an episode as *truncated* (``info["truncated_by"]`` says which): ``max_turns``, the
trajectory's ``max_tokens`` budget (or ``max_tokens_per_turn``), and the engine's context
(``max_model_len``), including an engine that reports a context overflow. A last answer cut by a
token limit (``finish_reason == "length"``) still goes to the environment, which grades it, and
the episode is recorded ``terminated=True`` (the environment ended it; its reward is final) and
``truncated=True`` (a limit cut the answer), which Gymnasium allows together. The learner bootstraps
only rows cut before the environment ended them (``truncated`` and not ``terminated``). An engine failure after
retries, or an exception from the environment, ends the episode as ``status="failed"`` with the
cause (``failure``: an ``env_error`` when the environment's own code raised or broke its return
contract, else an ``infra_error``; see :mod:`.env_calls`); it never crashes the run and never
loses the tokens sampled so far.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from ..chat import ChatRenderer
from ..clients import CompletionClient, SamplingParams
from ..errors import ContextOverflowError, EngineError
from ..records import Completion, Trajectory, TurnRecord, jsonable
from .env_calls import failure_of, reset_env, step_env
from .tools import assistant_message


@dataclass(frozen=True)
class LoopConfig:
    max_turns: int = 8
    max_tokens: int = 1024  # generated tokens per trajectory, all turns together
    max_tokens_per_turn: int | None = None  # None: whatever is left of max_tokens
    max_model_len: int = 4096  # the engine's context window
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens_per_turn is not None and self.max_tokens_per_turn < 1:
            raise ValueError(f"max_tokens_per_turn must be >= 1 or None, got {self.max_tokens_per_turn}")


class _Episode:
    """The growing token sequence of one episode."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.action_mask: list[int] = []
        self.logprobs: list[float] = []

    def observe(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.action_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def act(self, completion: Completion) -> None:
        self.token_ids += completion.token_ids
        self.action_mask += [1] * len(completion.token_ids)
        self.logprobs += completion.logprobs


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of an episode's ``turn`` (the same scheme for token and text episodes)."""
    return None if seed is None else seed * 1000 + turn


async def run_episode(
    env: gym.Env,
    client: CompletionClient,
    renderer: ChatRenderer,
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
    ep = _Episode()
    turns: list[TurnRecord] = []
    history: list[dict[str, Any]] = []  # what the template renders (assistant turns as sampled text)
    transcript: list[dict[str, Any]] = []  # what the env saw (assistant turns as parsed actions)
    reward, terminated, truncated = 0.0, False, False
    info: dict[str, Any] = {}
    status, error, failure, truncated_by = "ok", None, None, None
    tools_offered = bool(getattr(env.unwrapped, "tools", ()))
    per_turn = cfg.max_tokens_per_turn or cfg.max_tokens
    generated = 0
    try:
        obs, info = await reset_env(env, seed=seed, options={"task_id": task_id})
        history += obs
        transcript += obs
        ep.observe(renderer.prompt(obs))
        for turn in range(cfg.max_turns):
            budget_left, context_left = cfg.max_tokens - generated, cfg.max_model_len - len(ep.token_ids)
            room = min(per_turn, budget_left, context_left)
            if room <= 0:
                truncated_by = "max_tokens" if generated >= cfg.max_tokens else "context"
                break
            params = SamplingParams(max_tokens=room, temperature=cfg.temperature, top_p=cfg.top_p,
                                    seed=turn_seed(seed, turn))
            t_start = time.monotonic() - t0
            try:
                completion = await client.complete(ep.token_ids, params)
            except ContextOverflowError:
                truncated_by = "context"
                break
            turns.append(TurnRecord(len(ep.token_ids), len(completion.token_ids), completion.finish_reason,
                                    completion.weight_version, t_start, time.monotonic() - t0,
                                    completion.attempts, policy_versions=completion.policy_versions,
                                    token_versions=completion.token_versions))
            ep.act(completion)
            generated += len(completion.token_ids)
            action = assistant_message(completion.text, tools_offered=tools_offered, turn=turn)
            obs, r, terminated, truncated, info = await step_env(env, action)
            reward += r
            bridge_history = list(history)
            history += [{"role": "assistant", "content": completion.text}, *obs]
            transcript += [action, *obs]
            if terminated or truncated:
                if terminated and completion.finish_reason == "length":  # graded, but a limit cut the answer
                    truncated_by = length_cut(cfg, budget_left=budget_left, context_left=context_left)
                break
            ep.observe(renderer.bridge(bridge_history, completion, obs))
        else:
            truncated_by = "max_turns"
    except EngineError as exc:
        status, error, failure = "failed", f"{type(exc).__name__}: {exc}", failure_of(exc)
    except Exception as exc:  # noqa: BLE001 - a bad rollout is data: record the cause, keep the run going
        status, error, failure = "failed", f"{type(exc).__name__}: {exc}", failure_of(exc)
    info = final_info(info, status=status, error=error, truncated_by=truncated_by)
    return Trajectory(
        episode_id=episode_id or uuid.uuid4().hex,
        env=env_name,
        task_id=task_id,
        sample=sample,
        seed=seed,
        token_ids=tuple(ep.token_ids),
        action_mask=tuple(ep.action_mask),
        logprobs=tuple(ep.logprobs),
        turns=tuple(turns),
        messages=tuple(transcript),
        reward=reward,
        terminated=terminated and status == "ok",
        truncated=truncated or truncated_by is not None,
        status=status,
        error=error,
        info=jsonable(info),
        wall_s=time.monotonic() - t0,
        failure=failure,
    )


def length_cut(cfg: LoopConfig, *, budget_left: int, context_left: int | None = None) -> str:
    """The limit that cut a turn which ended at its ``max_tokens`` (``finish_reason == "length"``): the
    smallest of the episode's budget left, the per-turn cap and the context left (the budget on a tie)."""
    room = {"max_tokens": budget_left}
    if cfg.max_tokens_per_turn is not None:
        room["max_tokens_per_turn"] = cfg.max_tokens_per_turn
    if context_left is not None:
        room["context"] = context_left
    return min(room, key=room.__getitem__)


def final_info(info: dict[str, Any], *, status: str, error: str | None, truncated_by: str | None) -> dict[str, Any]:
    """The episode's last ``info``: ``truncated_by`` when a loop limit cut it, and the final keys the
    environment could not set (``correct`` False, ``answer`` None, ``error``) when it failed or was cut."""
    if truncated_by is not None:
        info = {**info, "truncated_by": truncated_by}
    if status == "failed" or truncated_by is not None:
        info = {"correct": False, "answer": None, **info, "error": error or info.get("error")}
    return info
