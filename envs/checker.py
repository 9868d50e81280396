"""``check_env``: does an environment keep the text-environment contract?

It checks what the agent loop and the learner rely on (see :mod:`sao.envs.core`): Gymnasium's
``reset``/``step`` signatures and return types, messages in the declared spaces, seeded
determinism, task selection by ``options={"task_id": ...}``, ``terminated`` kept apart from
``truncated``, the final ``info`` keys, and a clear error for a malformed action.
"""

from __future__ import annotations

import inspect
from typing import Any, SupportsFloat

import gymnasium as gym

from .core import FINAL_INFO_KEYS, AssistantMessageSpace, MessagesSpace


class EnvConformanceError(AssertionError):
    """The environment breaks the contract; the message lists every problem found."""


def check_env(env: gym.Env, *, max_steps: int = 8, seed: int = 0) -> None:
    """Raise :class:`EnvConformanceError` listing every contract violation found in a short run."""
    problems: list[str] = []

    def need(cond: bool, what: str) -> bool:
        if not cond:
            problems.append(what)
        return cond

    base = env.unwrapped
    need(isinstance(base, gym.Env), "the environment is not a gymnasium.Env")
    need(isinstance(env.observation_space, MessagesSpace), "observation_space is not a MessagesSpace")
    need(isinstance(env.action_space, AssistantMessageSpace), "action_space is not an AssistantMessageSpace")
    need(isinstance(getattr(base, "tools", None), (tuple, list)), "no `tools` attribute (a sequence of tool schemas)")
    params = inspect.signature(base.reset).parameters
    need(all(p in params and params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in ("seed", "options")),
         "reset must take keyword-only `seed` and `options`")

    ids = base.task_ids(limit=3) if callable(getattr(base, "task_ids", None)) else []
    need(bool(ids) and all(isinstance(t, str) for t in ids), "task_ids(limit=3) must return task id strings")

    first = _reset(env, need, seed=seed)
    if first is not None:
        need(_reset(env, need, seed=seed) == first, "reset with the same seed gave a different observation")
    for task_id in ids[:2]:
        got = _reset(env, need, options={"task_id": task_id})
        if got is not None:
            need(got[1].get("task_id") == task_id, f"reset(options={{'task_id': {task_id!r}}}) reported "
                                                   f"task_id {got[1].get('task_id')!r}")
    try:
        env.reset(options={"task_id": "\x00no-such-task"})
        problems.append("reset with an unknown task_id did not raise")
    except Exception:  # noqa: BLE001 - any clear error is fine
        pass

    if _reset(env, need, seed=seed) is not None:
        try:
            env.step(12345)
            problems.append("step(12345) (not a message) did not raise")
        except (ValueError, TypeError):
            pass
        except Exception as exc:  # noqa: BLE001
            problems.append(f"step(12345) raised {type(exc).__name__}, expected ValueError or TypeError")

    _episode(env, need, seed=seed, max_steps=max_steps)
    env.close()
    if problems:
        name = env.spec.id if env.spec else type(base).__name__
        raise EnvConformanceError(f"{name} breaks the text-environment contract:\n- " + "\n- ".join(problems))


def _reset(env: gym.Env, need, **kwargs: Any):
    try:
        out = env.reset(**kwargs)
    except Exception as exc:  # noqa: BLE001
        need(False, f"reset({kwargs}) raised {type(exc).__name__}: {exc}")
        return None
    if not need(isinstance(out, tuple) and len(out) == 2, "reset must return (observation, info)"):
        return None
    obs, info = out
    need(env.observation_space.contains(obs) and len(obs) > 0, "the first observation must be a non-empty message list")
    need(isinstance(info, dict), "reset's info must be a dict")
    return obs, info if isinstance(info, dict) else {}


def _episode(env: gym.Env, need, *, seed: int, max_steps: int) -> None:
    env.reset(seed=seed)
    for _ in range(max_steps):
        try:
            out = env.step(env.action_space.sample())
        except Exception as exc:  # noqa: BLE001
            need(False, f"step with a sampled action raised {type(exc).__name__}: {exc}")
            return
        if not need(isinstance(out, tuple) and len(out) == 5, "step must return a 5-tuple"):
            return
        obs, reward, terminated, truncated, info = out
        need(env.observation_space.contains(obs), "step's observation is not a message list")
        need(isinstance(reward, SupportsFloat), "reward must be a float")
        need(isinstance(terminated, bool) and isinstance(truncated, bool), "terminated/truncated must be bools")
        need(isinstance(info, dict), "step's info must be a dict")
        if terminated or truncated:
            missing = [k for k in FINAL_INFO_KEYS if k not in info]
            need(not missing, f"the final info lacks {missing}")
            need(isinstance(info.get("correct"), bool), "info['correct'] must be a bool")
            return
    need(False, f"no episode end within {max_steps} steps of a sampled action (set a step limit)")
