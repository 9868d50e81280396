"""What an environment offers evaluations and loops besides episodes: scripted agents, grading of given
predictions, the end of an episode that a loop's limit cut, its tasks' container images, and the brief
of a task for an external agent.

Each is a small callable Protocol that takes the (unwrapped) environment, so that the logic lives
beside the task it knows (``swe_policies``, ``swebench.grading``, ``math_envs``) and not in the
environment class. An environment class declares what it offers as class attributes::

    class MyEnv(TextEnv):
        scripted_policies = staticmethod(my_baseline_policy)    # a ScriptedPolicies
        prediction_grader = staticmethod(my_grade_prediction)   # a PredictionGrader

(``staticmethod``, so that the class attribute stays a plain function.) A method of the class
fits too: looked up on the class, it is a function of the environment as its first argument, as
:class:`CutGrading`'s ``finish_cut`` is. Evaluations and loops find them with
:func:`scripted_policies`, :func:`prediction_grader` and :func:`cut_grading`, which give None for
an environment that does not offer them; nothing is registered at import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym

from sao.sandboxes import SandboxLimits

from .core import Message

Policy = Callable[[list[Message], dict[str, Any]], Message]
"""``(observation_messages, info) -> assistant message``: an agent without a model."""


class ScriptedPolicies(Protocol):
    """``(env, name, task_id) -> Policy``: the model-free agent ``name`` (``gold``: the reference
    solution, ``empty``: nothing) for task ``task_id``; an unknown name raises ``ValueError``."""

    def __call__(self, env: Any, name: str, task_id: str) -> Policy: ...


class PredictionGrader(Protocol):
    """``(env, task_id, patch) -> info``: grade a given prediction without running an agent (a patch for
    SWE, an answer for math); the final ``info`` an episode would end with (``correct``, ``answer``,
    ``error``, ...)."""

    def __call__(self, env: Any, task_id: str, patch: str) -> dict[str, Any]: ...


class CutGrading(Protocol):
    """``(env, reason) -> (reward, info)``, declared as ``finish_cut``: end the episode in progress that a
    limit of the agent loop cut (``reason``: ``max_turns``, ``max_tokens``, ``max_tokens_per_turn`` or
    ``context``, see :mod:`sao.agents.loop.exits`) as the environment would end it, and return its final
    reward and ``info`` (with ``correct``, ``answer``, ``error`` and ``exit_status``). The loop then records
    that reward as final (``terminated`` and ``truncated``). The SWE environments grade the working
    tree's diff (autosubmit) or, with ``autosubmit=False``, score an empty patch."""

    def __call__(self, env: Any, reason: str) -> tuple[float, dict[str, Any]]: ...


class InstanceImages(Protocol):
    """The images of a container-per-task environment, declared as ``instance_images``, a class that
    takes the environment: ``prepare(task_ids)`` finds (pulls, builds) every task's image before any
    episode starts and says which are missing and why; ``disk_bytes()`` is the disk the images take;
    ``clean(names)`` removes images a run pulled or built (never one the user named). The SWE
    environments' is :class:`sao.envs.swebench.image_prep.EnvImages`."""

    def prepare(self, task_ids: Sequence[str]) -> Any: ...

    def disk_bytes(self) -> int | None: ...

    def clean(self, owned_images: Iterable[str]) -> Any: ...


@dataclass(frozen=True)
class TaskBrief:
    """A task as an external agent is told it, without the environment starting anything for it.

    messages:  the opening messages an episode would start with (system and user).
    image:     the task's container image, resolved (pulled or built) when it has one; else None.
    repo_path: the repository's path inside that image (SWE: ``/testbed``); else None.
    limits:    the limits for a container the agent starts on it (the environment's own); else None.
    facts:     what else the task states (JSON-able: an instance id, a base commit).
    """

    messages: tuple[Message, ...]
    image: str | None = None
    repo_path: str | None = None
    limits: SandboxLimits | None = None
    facts: dict[str, Any] = field(default_factory=dict)


class TaskBriefing(Protocol):
    """``(env, task_id) -> TaskBrief``, declared as ``brief``: the task for an agent that runs on its own
    (an external agent in its own container), without the episode's own sandbox that ``reset`` starts.
    An environment without it is briefed by its ``reset``."""

    def __call__(self, env: Any, task_id: str) -> TaskBrief: ...


def scripted_policies(env: gym.Env) -> ScriptedPolicies | None:
    """The scripted agents ``env``'s class offers, or None."""
    return _declared(env, "scripted_policies")


def prediction_grader(env: gym.Env) -> PredictionGrader | None:
    """How ``env``'s class grades a given prediction (``--grade-only``), or None."""
    return _declared(env, "prediction_grader")


def task_briefing(env: gym.Env) -> TaskBriefing | None:
    """How ``env``'s class briefs an external agent without a ``reset`` (``brief``), or None."""
    return _declared(env, "brief")


def cut_grading(env: gym.Env) -> CutGrading | None:
    """How ``env``'s class ends an episode that a loop's limit cut (``finish_cut``), or None."""
    return _declared(env, "finish_cut")


def instance_images(env: gym.Env) -> InstanceImages | None:
    """``env``'s images (``--prepare``, ``--clean-images``), or None for an environment without images."""
    declared = _declared(env, "instance_images")
    return None if declared is None else declared(env.unwrapped)


def _declared(env: gym.Env, name: str) -> Any:
    found = getattr(type(env.unwrapped), name, None)
    return found if callable(found) else None
