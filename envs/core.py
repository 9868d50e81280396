"""The multi-turn text environment contract, on top of `gymnasium.Env`.

An episode is a chat. Observations are the chat messages that are *new since the last step*
(the first observation holds the system and user prompt); actions are assistant messages.
Everything else is Gymnasium's contract, exactly:

* ``reset(*, seed=None, options=None) -> (observation, info)``; ``options={"task_id": ...}``
  selects a task, otherwise one is drawn with ``self.np_random``.
* ``step(action) -> (observation, reward, terminated, truncated, info)``; the reward is a finite real
  number (:func:`reward_problem`: a string or a bool is refused, not converted). ``terminated`` means
  the task reached an end state (answer graded, patch submitted); ``truncated`` means it was cut
  (step limit) and a learner should bootstrap.
* The final ``info`` always holds ``correct`` (bool), ``answer`` (what was graded, or None) and
  ``error`` (None, or why the episode could not be graded normally). See :data:`FINAL_INFO_KEYS`.

Messages are plain OpenAI chat dicts (``{"role": ..., "content": ...}``, plus ``tool_calls`` /
``tool_call_id`` for tools), because that is what every OpenAI-compatible endpoint and every
chat template already speaks.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

Message = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")
FINAL_INFO_KEYS = ("correct", "answer", "error")


class MessagesSpace(spaces.Space):
    """A list of chat messages (the observation space of every text environment)."""

    def __init__(self, roles: tuple[str, ...] = ROLES):
        super().__init__(shape=None, dtype=None)
        self.roles = roles

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(_is_message(m, self.roles) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        return [{"role": "user", "content": "hello"}]

    def __repr__(self) -> str:
        return f"MessagesSpace(roles={self.roles})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace) and other.roles == self.roles


class AssistantMessageSpace(spaces.Space):
    """One assistant message: text ``content`` and, when the env offers tools, ``tool_calls``."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if not _is_message(x, ("assistant",)):
            return False
        calls = x.get("tool_calls")
        return calls is None or (isinstance(calls, list) and all(_is_tool_call(c) for c in calls))

    def sample(self, mask: Any = None, probability: Any = None) -> Message:
        return {"role": "assistant", "content": "I do not know."}

    def __repr__(self) -> str:
        return "AssistantMessageSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AssistantMessageSpace)


def _is_message(m: Any, roles: tuple[str, ...]) -> bool:
    return (
        isinstance(m, dict)
        and m.get("role") in roles
        and (isinstance(m.get("content"), str) or (m.get("content") is None and "tool_calls" in m))
    )


def _is_tool_call(c: Any) -> bool:
    fn = c.get("function") if isinstance(c, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), str)


def reward_problem(reward: Any) -> str | None:
    """Why ``reward`` is not a reward (a finite real number: int or float, numpy's included; not a
    bool, not a string), or None."""
    if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real):
        return f"reward must be a real number (int or float), got {type(reward).__name__} {reward!r:.60}"
    if not math.isfinite(reward):
        return f"reward must be finite, got {reward!r}"
    return None


def as_action(action: Any) -> Message:
    """Accept a bare string as shorthand for an assistant message; reject anything else malformed.

    A malformed action is a programming error of the caller (the agent loop always sends a
    well-formed message, with tool-call parse errors carried inside it), so it raises.
    """
    if isinstance(action, str):
        return {"role": "assistant", "content": action}
    if not AssistantMessageSpace().contains(action):
        raise ValueError(
            "action must be an assistant message dict like {'role': 'assistant', 'content': '...'}"
            f" (optionally with 'tool_calls'); got {type(action).__name__}: {str(action)[:200]}"
        )
    return action


class TextEnv(gym.Env):
    """Base class for multi-turn text environments. Subclasses implement the task logic.

    Class attributes: ``tools`` (OpenAI tool schemas offered to the agent; empty = no tools) and
    ``endless`` (the task source is generated and never runs out).
    Subclasses implement :meth:`task_ids`, :meth:`_begin` and :meth:`_respond`.
    """

    metadata = {"render_modes": ["ansi"]}
    observation_space = MessagesSpace()
    action_space = AssistantMessageSpace()
    tools: tuple[dict[str, Any], ...] = ()
    endless: bool = False  # True when task_ids() needs a limit (generated tasks)

    def __init__(self, render_mode: str | None = None):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.transcript: list[Message] = []
        self._done = True

    # -- to implement ------------------------------------------------------------------------
    def task_ids(self, limit: int | None = None) -> list[str]:
        """The task ids in their canonical order (the first ``limit`` for endless sources)."""
        raise NotImplementedError

    def _begin(self, task_id: str | None) -> tuple[list[Message], dict[str, Any]]:
        """Start the task (``None``: draw one with ``self.np_random``); return the first messages and info."""
        raise NotImplementedError

    def _respond(self, action: Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """React to one assistant message."""
        raise NotImplementedError

    # -- gymnasium ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        task_id = options.pop("task_id", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; known: ['task_id']")
        obs, info = self._begin(None if task_id is None else str(task_id))
        self.transcript = list(obs)
        self._done = False
        return obs, info

    def step(self, action: Any):
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        action = as_action(action)
        self.transcript.append(action)
        obs, reward, terminated, truncated, info = self._respond(action)
        if (problem := reward_problem(reward)) is not None:  # float() would turn "1" or True into 1.0
            raise ValueError(f"{type(self).__name__}._respond: {problem}")
        self.transcript.extend(obs)
        self._done = terminated or truncated
        if self._done:
            missing = [k for k in FINAL_INFO_KEYS if k not in info]
            if missing:
                raise AssertionError(f"{type(self).__name__} ended an episode without info keys {missing}")
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"[{m['role']}]\n{m.get('content') or ''}" for m in self.transcript)
