"""Scripted policies for the SWE environments: evaluation of the plumbing without a model.

A policy is a callable ``(observation_messages, info) -> assistant message``. These drive the
environment through its real tools (``editor``, ``bash``, ``submit``), one tool call per turn,
so that the whole path (container, tools, diff, grading) is exercised:

* :func:`gold_policy` writes the instance's gold patch with ``editor create`` to
  ``/tmp/gold.patch``, applies it with ``bash git apply``, then submits: it should be resolved.
* :func:`empty_policy` submits at once: it must not be resolved.
* :func:`scripted_policy` makes any list of tool calls, then submits.

:func:`baseline_policy` is the SWE environments' :class:`~sao.envs.capabilities.ScriptedPolicies`
(``--agent gold|empty``).

:func:`play` runs one episode with a policy and returns the final ``info``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .capabilities import Policy
from .core import Message

GOLD_PATCH_PATH = "/tmp/gold.patch"


def tool_call(name: str, arguments: Mapping[str, Any] | None = None, *, call_id: str = "call_0") -> dict[str, Any]:
    """One OpenAI-style tool call."""
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(dict(arguments or {}))}}


class ScriptedPolicy:
    """Makes the scripted tool calls one per turn, then calls ``submit`` (every later turn too)."""

    def __init__(self, calls: Sequence[tuple[str, Mapping[str, Any]]]):
        self.calls = list(calls)
        self._turn = 0
        self._ids = itertools.count(1)

    def __call__(self, observation: list[Message], info: dict[str, Any]) -> Message:
        name, args = self.calls[self._turn] if self._turn < len(self.calls) else ("submit", {})
        self._turn += 1
        return {"role": "assistant", "content": "",
                "tool_calls": [tool_call(name, args, call_id=f"call_{next(self._ids)}")]}


def scripted_policy(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> ScriptedPolicy:
    """A fresh policy that makes ``calls`` (``(tool name, arguments)`` pairs), then submits."""
    return ScriptedPolicy(calls)


def patch_policy(patch: str, *, path: str = GOLD_PATCH_PATH) -> ScriptedPolicy:
    """Write ``patch`` with the editor, apply it with ``git apply``, submit."""
    return ScriptedPolicy([
        ("editor", {"command": "create", "path": path, "file_text": patch}),
        ("bash", {"command": f"git apply --verbose {path} && rm -f {path}"}),
    ])


def gold_policy(instance: Any) -> ScriptedPolicy:
    """Apply the instance's gold patch through the tools, then submit. ``instance``: an
    :class:`~sao.envs.swebench.SWEInstance` or a SWE-bench row (a mapping with ``patch``)."""
    patch = instance["patch"] if isinstance(instance, Mapping) else instance.patch
    return patch_policy(patch)


def empty_policy() -> ScriptedPolicy:
    """Submit without changing anything."""
    return ScriptedPolicy([])


def baseline_policy(env: Any, name: str, task_id: str) -> ScriptedPolicy:
    """A model-free agent for task ``task_id`` of a SWE environment (its ``get``): ``gold`` applies the
    gold patch, ``empty`` submits nothing."""
    if name == "gold":
        return gold_policy(env.get(task_id))
    if name == "empty":
        return empty_policy()
    raise ValueError(f"unknown scripted agent {name!r}; this environment has 'gold' and 'empty'")


def play(env: Any, policy: Policy, *, task_id: str | None = None, seed: int | None = None,
         max_turns: int = 1000) -> dict[str, Any]:
    """Run one episode of ``env`` with ``policy``; the final ``info`` (with ``reward``,
    ``terminated`` and ``truncated`` added)."""
    options = {"task_id": task_id} if task_id is not None else None
    obs, info = env.reset(seed=seed, options=options)
    for _ in range(max_turns):
        obs, reward, terminated, truncated, info = env.step(policy(obs, info))
        if terminated or truncated:
            return {**info, "reward": reward, "terminated": terminated, "truncated": truncated}
    raise RuntimeError(f"the episode did not end within {max_turns} turns")
