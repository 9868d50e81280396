"""Episodes without a model: a scripted policy plays (gold/empty baselines, plumbing checks), or
a given patch is only graded (``--grade-only``).

A policy is ``(observation_messages, info) -> assistant message``. The trajectory has the
transcript, reward and info, and no tokens: nothing was sampled.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import gymnasium as gym

from sao.envs.capabilities import Policy, prediction_grader

from ..records import Trajectory, jsonable
from .env_calls import call_env, failure_of, finish_cut_env, reset_env, step_env
from .exits import with_exit_status


async def run_scripted_episode(env: gym.Env, policy: Policy, *, env_name: str, task_id: str, sample: int = 0,
                               seed: int | None = None, max_turns: int = 50) -> Trajectory:
    """Like :func:`~sao.agents.loop.token_loop.run_episode`, with ``policy`` (the environment's code too) in place
    of the engine."""
    t0 = time.monotonic()
    transcript: list[dict[str, Any]] = []
    reward, terminated, truncated, status, error, failure = 0.0, False, False, "ok", None, None
    truncated_by: str | None = None
    info: dict[str, Any] = {}
    try:
        obs, info = await reset_env(env, seed=seed, options={"task_id": task_id})
        transcript += obs
        for _ in range(max_turns):
            action = call_env("the scripted policy", policy, obs, info)
            obs, r, terminated, truncated, info = await step_env(env, action)
            reward += r
            transcript += [action, *obs]
            if terminated or truncated:
                break
        else:  # the turn limit cut it: an environment that offers CutGrading ends it (skeleton._finish_cut)
            truncated_by, truncated = "max_turns", True
            if (finished := await finish_cut_env(env, truncated_by)) is not None:
                r, info = finished
                reward, terminated = reward + r, True
    except Exception as exc:  # noqa: BLE001 - a failed episode is recorded, not raised
        status, error, failure = "failed", f"{type(exc).__name__}: {exc}", failure_of(exc)
    if truncated_by is not None:
        info = {**info, "truncated_by": truncated_by}
    if status == "failed" or not (terminated or truncated) or "correct" not in info:
        info = {"correct": False, "answer": None, **info, "error": error or info.get("error")}
    info = with_exit_status(info, status=status, failure=failure, truncated_by=truncated_by, terminated=terminated,
                            truncated=truncated)
    return Trajectory(
        episode_id=uuid.uuid4().hex, env=env_name, task_id=task_id, sample=sample, seed=seed,
        token_ids=(), action_mask=(), logprobs=(), turns=(), messages=tuple(transcript), reward=reward,
        terminated=terminated and status == "ok", truncated=truncated, status=status, error=error,
        info=jsonable(info),
        wall_s=time.monotonic() - t0, failure=failure,
    )


async def run_graded_patch(env: gym.Env, patch: str, *, env_name: str, task_id: str) -> Trajectory:
    """Grade ``patch`` for ``task_id`` with the environment's
    :class:`~sao.envs.capabilities.PredictionGrader` (no agent runs)."""
    t0 = time.monotonic()
    status, error = "ok", None
    try:
        grade = prediction_grader(env)
        if grade is None:
            raise TypeError(f"{type(env.unwrapped).__name__} cannot grade predictions")
        info = await asyncio.to_thread(grade, env.unwrapped, task_id, patch)
    except Exception as exc:  # noqa: BLE001
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        info = {"correct": False, "answer": None, "error": error}
    info = with_exit_status(info, status=status, failure=None, truncated_by=None, terminated=True, truncated=False)
    return Trajectory(
        episode_id=uuid.uuid4().hex, env=env_name, task_id=task_id, sample=0, seed=None, token_ids=(),
        action_mask=(), logprobs=(), turns=(), messages=(), reward=float(bool(info.get("correct"))),
        terminated=status == "ok", truncated=False, status=status, error=error, info=jsonable(info),
        wall_s=time.monotonic() - t0,
    )
