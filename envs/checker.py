"""``check_env``: does an environment keep the text-environment contract?

It checks what the agent loop and the learner rely on (see :mod:`sao.envs.core`): Gymnasium's
``reset``/``step`` signatures and return shapes (``reset`` a 2-tuple, ``step`` a 5-tuple whose reward
is a real number), messages in the declared spaces, seeded determinism, task selection by
``options={"task_id": ...}``, ``terminated`` kept apart from ``truncated``, the final ``info`` keys,
and a clear error for a malformed action.

Seeded determinism is checked without luck: under each of several seeds, two resets must give the
same first observation and leave ``np_random`` in the same state, with the global ``random`` and
``numpy.random`` states set to different values before each (restored afterwards). A reset that draws
from a global generator, or never seeds ``self.np_random`` (no ``super().reset(seed=seed)``), fails
every time; one that draws from a generator of its own that it never seeds fails unless all its
draws repeat.

:func:`check_episode` is the short form that ``sao-eval`` runs before it starts an engine: the
declarations, one reset of one task, and one episode of sampled actions. :func:`reset_problem` and
:func:`step_problem` are the return-value checks alone, for loops that call an environment.
"""

from __future__ import annotations

import contextlib
import inspect
import random
from collections.abc import Iterator
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from .core import FINAL_INFO_KEYS, AssistantMessageSpace, MessagesSpace, TextEnv, reward_problem

DETERMINISM_SEEDS = 3  # seeds checked, each reset twice under different global random states
_MESSAGES = MessagesSpace()

Need = Callable[[bool, str], bool]


class EnvConformanceError(AssertionError):
    """The environment breaks the contract; the message lists every problem found."""


# -- return values ------------------------------------------------------------------------------


def reset_problem(out: Any) -> str | None:
    """Why ``out`` is not what ``reset`` returns (``(observation, info)``: a message list and a dict), or None."""
    if not (isinstance(out, tuple) and len(out) == 2):
        return f"reset must return a 2-tuple (observation, info), got {_shape(out)}"
    obs, info = out
    if not (_MESSAGES.contains(obs) and len(obs) > 0):
        return f"reset's observation must be a non-empty list of chat messages, got {type(obs).__name__} {obs!r:.100}"
    if not isinstance(info, dict):
        return f"reset's info must be a dict, got {type(info).__name__}"
    return None


def step_problem(out: Any) -> str | None:
    """Why ``out`` is not what ``step`` returns (``(observation, reward, terminated, truncated, info)``), or None."""
    if not (isinstance(out, tuple) and len(out) == 5):
        return f"step must return a 5-tuple (observation, reward, terminated, truncated, info), got {_shape(out)}"
    obs, reward, terminated, truncated, info = out
    if not _MESSAGES.contains(obs):
        return f"step's observation must be a list of chat messages, got {type(obs).__name__} {obs!r:.100}"
    if (problem := reward_problem(reward)) is not None:
        return problem
    if not all(isinstance(x, (bool, np.bool_)) for x in (terminated, truncated)):
        return (f"terminated and truncated must be bools, got {type(terminated).__name__} and "
                f"{type(truncated).__name__}")
    if not isinstance(info, dict):
        return f"step's info must be a dict, got {type(info).__name__}"
    return None


def _shape(out: Any) -> str:
    return f"a tuple of {len(out)}" if isinstance(out, tuple) else f"{type(out).__name__} {out!r:.60}"


# -- the checks ---------------------------------------------------------------------------------


def check_env(env: gym.Env, *, max_steps: int = 8, seed: int = 0) -> None:
    """Raise :class:`EnvConformanceError` listing every contract violation found in a short run; closes ``env``."""
    problems: list[str] = []
    need = _needer(problems)
    ids = _declarations(env, need)
    _seeding(env, need, seed)
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

    _episode(env, need, max_steps=max_steps, seed=seed)
    env.close()
    _raise(env, problems)


def check_episode(env: gym.Env, *, task_id: str | None = None, max_steps: int = 8) -> None:
    """The short check (one task, scripted actions): the declarations, then one episode of sampled
    actions on ``task_id`` (default: the first of ``task_ids``), up to ``max_steps`` of them (an
    episode still running then is fine here: the agent loop has its own turn limit). Raises
    :class:`EnvConformanceError`; leaves ``env`` open for its owner to close."""
    problems: list[str] = []
    need = _needer(problems)
    ids = _declarations(env, need)
    if task_id is None and ids:
        task_id = ids[0]
    _episode(env, need, max_steps=max_steps, options=None if task_id is None else {"task_id": task_id},
             must_end=False)
    _raise(env, problems)


def _needer(problems: list[str]) -> Need:
    def need(cond: bool, what: str) -> bool:
        if not cond:
            problems.append(what)
        return cond

    return need


def _raise(env: gym.Env, problems: list[str]) -> None:
    if problems:
        name = env.spec.id if env.spec else type(env.unwrapped).__name__
        raise EnvConformanceError(f"{name} breaks the text-environment contract:\n- " + "\n- ".join(problems))


def _declarations(env: gym.Env, need: Need) -> list[str]:
    """The spaces, tools and ``reset`` signature; the first task ids."""
    base = env.unwrapped
    need(isinstance(base, gym.Env), "the environment is not a gymnasium.Env")
    need(isinstance(env.observation_space, MessagesSpace), "observation_space is not a MessagesSpace")
    need(isinstance(env.action_space, AssistantMessageSpace), "action_space is not an AssistantMessageSpace")
    need(isinstance(getattr(base, "tools", None), (tuple, list)), "no `tools` attribute (a sequence of tool schemas)")
    params = inspect.signature(base.reset).parameters
    need(all(p in params and params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in ("seed", "options")),
         "reset must take keyword-only `seed` and `options`")
    try:
        ids = base.task_ids(limit=3) if callable(getattr(base, "task_ids", None)) else []
    except Exception as exc:  # noqa: BLE001
        need(False, f"task_ids(limit=3) raised {type(exc).__name__}: {exc}")
        return []
    if not need(isinstance(ids, (list, tuple)) and bool(ids) and all(isinstance(t, str) for t in ids),
                "task_ids(limit=3) must return a non-empty list of task id strings"):
        return []
    return list(ids)


def _seeding(env: gym.Env, need: Need, seed: int) -> None:
    """Under each seed, two resets with different global random states give the same observation
    and the same ``np_random`` state, and ``np_random`` is seeded with it (module doc)."""
    base = env.unwrapped
    for s in range(seed, seed + DETERMINISM_SEEDS):
        seen = []
        for pin in (2 * s, 2 * s + 1):
            with _global_random(pin):
                got = _reset(env, need, seed=s)
            if got is None:
                return
            seen.append((got[0], _rng_state(base), getattr(base, "_np_random_seed", None)))
        (obs_a, rng_a, seeded), (obs_b, rng_b, _) = seen
        if not need(obs_a == obs_b, f"reset(seed={s}) gave different observations on two calls: the first "
                                    "observation must depend on the seed alone (draw with self.np_random)"):
            return
        if not need(rng_a == rng_b and seeded == s,
                    f"reset(seed={s}) did not seed self.np_random (call super().reset(seed=seed) first)"):
            return


def _rng_state(base: Any) -> Any:
    rng = getattr(base, "_np_random", None)
    return None if rng is None else rng.bit_generator.state


@contextlib.contextmanager
def _global_random(pin: int) -> Iterator[None]:
    """Python's and numpy's global random states set from ``pin``, and restored afterwards."""
    saved = random.getstate(), np.random.get_state()
    random.seed(pin)
    np.random.seed(pin)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


def _reset(env: gym.Env, need: Need, **kwargs: Any) -> tuple[list, dict] | None:
    try:
        out = env.reset(**kwargs)
    except Exception as exc:  # noqa: BLE001
        need(False, f"reset({kwargs}) raised {type(exc).__name__}: {exc}")
        return None
    if not need((problem := reset_problem(out)) is None, f"reset({kwargs}): {problem}"):
        return None
    return out


def _episode(env: gym.Env, need: Need, *, max_steps: int, seed: int | None = None,
             options: dict[str, Any] | None = None, must_end: bool = True) -> None:
    if _reset(env, need, seed=seed, options=options) is None:
        return
    with _returned(env) as raw:
        for _ in range(max_steps):
            raw.clear()
            try:
                out = env.step(env.action_space.sample())
            except Exception as exc:  # noqa: BLE001
                need(False, _respond_problem(raw) or f"step with a sampled action raised {type(exc).__name__}: {exc}")
                return
            if not need((problem := _respond_problem(raw) or step_problem(out)) is None, problem or ""):
                return
            obs, reward, terminated, truncated, info = out
            if terminated or truncated:
                missing = [k for k in FINAL_INFO_KEYS if k not in info]
                need(not missing, f"the final info lacks {missing}")
                need(isinstance(info.get("correct"), bool), "info['correct'] must be a bool")
                return
    need(not must_end, f"no episode end within {max_steps} steps of a sampled action (set a step limit)")


@contextlib.contextmanager
def _returned(env: gym.Env) -> Iterator[list[Any]]:
    """What a :class:`TextEnv`'s ``_respond`` returned, call by call: ``TextEnv.step`` unpacks it, so a
    4-tuple would fail there with Python's unpacking message instead of the contract's."""
    base, raw = env.unwrapped, []
    if not isinstance(base, TextEnv):
        yield raw
        return
    respond = base._respond

    def recorded(action: Any) -> Any:
        raw.append(out := respond(action))
        return out

    base._respond = recorded  # an instance attribute over the class's method, removed below
    try:
        yield raw
    finally:
        del base._respond


def _respond_problem(raw: list[Any]) -> str | None:
    if not raw:
        return None
    out = raw[-1]
    if not (isinstance(out, tuple) and len(out) == 5):
        return ("_respond must return a 5-tuple (observation, reward, terminated, truncated, info), "
                f"got {_shape(out)}")
    return reward_problem(out[1])
