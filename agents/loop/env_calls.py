"""Calls from an episode loop into the environment's own code, and whose fault a failure was.

The loops (token, text, scripted) call the environment through :func:`reset_env`, :func:`step_env`,
:func:`finish_cut_env` (an episode a loop limit cut) and :func:`call_env`. What the environment's code
raises, or returns against Gymnasium's contract (a 4-tuple, a reward that is not a real number:
:func:`sao.envs.checker.step_problem`), becomes an :class:`EnvCodeError`, and the episode is recorded
as failed with ``failure="env_error"``: running it again would fail the same way. The machinery under
the environment failing is not the environment's fault and propagates as it is, to be recorded as
``failure="infra_error"`` like an engine error: a sandbox (:class:`~sao.sandboxes.SandboxError`: container, Docker), the operating
system (``OSError``: disk, network, timeouts) or memory. :func:`failure_of` names the cause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium as gym

from sao.envs.capabilities import cut_grading
from sao.envs.checker import reset_problem, step_problem
from sao.envs.core import FINAL_INFO_KEYS, reward_problem
from sao.sandboxes import SandboxError

from ..errors import AgentError
from ..records import ENV_ERROR, INFRA_ERROR

T = TypeVar("T")
INFRASTRUCTURE = (SandboxError, OSError, MemoryError)  # raised inside env code, yet not the env's fault


class EnvCodeError(AgentError):
    """The environment's own code raised, or returned what Gymnasium's contract does not allow."""


def call_env(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, environment code; what it raises becomes an :class:`EnvCodeError`
    naming ``what``, except :data:`INFRASTRUCTURE` errors, which propagate unchanged."""
    try:
        return fn(*args, **kwargs)
    except INFRASTRUCTURE:
        raise
    except Exception as exc:  # noqa: BLE001 - the environment's code, whatever it raised
        raise EnvCodeError(f"{what} raised {type(exc).__name__}: {exc}") from exc


async def reset_env(env: gym.Env, **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``env.reset(**kwargs)`` in a thread, its return checked."""
    out = await asyncio.to_thread(call_env, "env.reset", env.reset, **kwargs)
    if (problem := reset_problem(out)) is not None:
        raise EnvCodeError(f"env.reset: {problem}")
    return out


async def step_env(env: gym.Env, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
    """``env.step(action)`` in a thread, its return checked; reward as a float, the flags as bools."""
    out = await asyncio.to_thread(call_env, "env.step", env.step, action)
    if (problem := step_problem(out)) is not None:
        raise EnvCodeError(f"env.step: {problem}")
    obs, reward, terminated, truncated, info = out
    return obs, float(reward), bool(terminated), bool(truncated), info


async def finish_cut_env(env: gym.Env, reason: str) -> tuple[float, dict[str, Any]] | None:
    """End the episode in progress that the loop's limit ``reason`` cut, when ``env`` offers
    :class:`~sao.envs.capabilities.CutGrading` (None when not): its ``finish_cut`` in a thread, its return
    checked (a real reward, a final ``info``), the reward as a float."""
    if (finish := cut_grading(env)) is None:
        return None
    out = await asyncio.to_thread(call_env, "env.finish_cut", finish, env.unwrapped, reason)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise EnvCodeError(f"env.finish_cut must return (reward, info), got {type(out).__name__}")
    reward, info = out
    if (problem := reward_problem(reward)) is not None:
        raise EnvCodeError(f"env.finish_cut: {problem}")
    if not isinstance(info, dict) or (missing := [k for k in FINAL_INFO_KEYS if k not in info]):
        raise EnvCodeError(f"env.finish_cut: info must be a dict with {list(FINAL_INFO_KEYS)}, got "
                           f"{sorted(info) if isinstance(info, dict) else type(info).__name__}")
    return float(reward), info


def failure_of(exc: BaseException) -> str:
    """The recorded cause of an episode that ``exc`` ended: ``env_error`` or ``infra_error``."""
    return ENV_ERROR if isinstance(exc, EnvCodeError) else INFRA_ERROR
