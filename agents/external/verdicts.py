"""What an external agent's episode comes to: a failure of the agent, or the environment's grade of what
it returned (:class:`Verdict`).

The causes of a failed episode, each with ``status="failed"`` and its ``error`` naming it, never a 0
reward for an episode that was not graded:

* ``agent_timeout``: it ran past its timeout and was killed, with its process group;
* ``agent_error``: it raised (its type and message), or its process died without a result;
* ``no_calls``: (training only, ``require_calls``) it never called the model, so nothing was sampled;

these three with ``failure="agent_error"`` (:data:`~sao.agents.records.AGENT_ERROR`); and ``grading
failed``: the environment's grader raised or reported an error (an infrastructure error, or the
environment's own code: :func:`~sao.agents.loop.env_calls.failure_of`), or it has none.

What is graded is the result's ``patch`` for a task with a repository (SWE, ``AgentTask.repo_path``),
else its ``answer``; None is graded as nothing given (an empty patch, no answer): a wrong answer, not a
failure.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from sao.envs.capabilities import prediction_grader

from ..loop.env_calls import call_env, failure_of
from ..records import AGENT_ERROR, ENV_ERROR, INFRA_ERROR
from .process import ChildRun
from .task import AgentResult, AgentTask
from .wire import ChildError


@dataclass(frozen=True)
class Verdict:
    """How the episode ended: ``status`` "ok" (graded: ``reward`` and the grader's ``info``) or "failed"
    (``failure``, ``error``), and its ``exit_status`` (:mod:`sao.agents.loop.exits`)."""

    status: str
    exit_status: str
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None
    error: str | None = None

    @classmethod
    def failed(cls, failure: str, exit_status: str, error: str, info: dict[str, Any] | None = None) -> Verdict:
        return cls("failed", exit_status, 0.0, {"correct": False, "answer": None, **(info or {})}, failure, error)


def agent_failure(run: ChildRun, timeout_s: float, *, n_calls: int, require_calls: bool) -> Verdict | None:
    """The agent's own failure in ``run`` (module doc), or None when it returned a result to grade."""
    if run.timed_out:
        return Verdict.failed(AGENT_ERROR, "agent_timeout",
                              f"agent_timeout: the agent ran past its {timeout_s:g} s timeout and was killed")
    if isinstance(run.outcome, ChildError):
        return Verdict.failed(AGENT_ERROR, "agent_error",
                              f"agent_error: the agent raised {run.outcome.type}: {run.outcome.message}",
                              {"traceback": run.outcome.traceback})
    if run.outcome is None:
        return Verdict.failed(AGENT_ERROR, "agent_error", f"agent_error: {run.problem}")
    if require_calls and n_calls == 0:
        return Verdict.failed(AGENT_ERROR, "no_calls", "no_calls: the agent never called the model endpoint, "
                                                        "so there is nothing to train on")
    return None


def prediction_of(task: AgentTask, result: AgentResult) -> str:
    """What the environment grades (module doc): the patch for a task with a repository, else the answer."""
    given = result.patch if task.repo_path is not None else result.answer
    return given or ""


async def graded(env: gym.Env, task: AgentTask, result: AgentResult) -> Verdict:
    """The environment's own grade of ``result`` (its :class:`~sao.envs.capabilities.PredictionGrader`,
    in a thread: SWE grades in a fresh container), or a ``grading failed`` verdict."""
    grade = prediction_grader(env)
    if grade is None:
        return Verdict.failed(ENV_ERROR, ENV_ERROR, f"grading failed: {type(env.unwrapped).__name__} cannot grade "
                                                    "an agent's answer or patch (it offers no prediction_grader)")
    try:
        info = await asyncio.to_thread(call_env, "the environment's grader", grade, env.unwrapped, task.task_id,
                                       prediction_of(task, result))
    except Exception as exc:  # noqa: BLE001 - a grading that broke is a recorded failure
        kind = failure_of(exc)
        return Verdict.failed(kind, kind, f"grading failed: {type(exc).__name__}: {exc}")
    if not isinstance(info, dict):
        return Verdict.failed(ENV_ERROR, ENV_ERROR, f"grading failed: the grader returned {type(info).__name__}, "
                                                    "not an info dict")
    if info.get("error"):  # the grading could not run (no image, a grading container that failed)
        return Verdict.failed(INFRA_ERROR, INFRA_ERROR, f"grading failed: {info['error']}", info)
    return Verdict("ok", "agent_returned", float(bool(info.get("correct"))), {**info, "exit_status": "agent_returned"})
