"""The JSON that crosses the process boundary between the runner and an agent's subprocess.

A :class:`Job` (which plug-in to call, the :class:`~.task.AgentTask` and the
:class:`~.task.AgentEndpoint`) goes in as one JSON object; the child answers with one JSON object in a
result file (never on stdout, where agents print): ``{"ok": true, "result": AgentResult}`` or
``{"ok": false, "error": {"type", "message", "traceback"}}`` (:class:`ChildError`). Decoding checks the
shape, so that a child that wrote something else is reported as such, not trusted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from .task import AgentEndpoint, AgentResult, AgentTask, SandboxRules


@dataclass(frozen=True)
class Job:
    """One run of a plug-in: ``target`` is its entry point's ``module:callable``."""

    target: str
    task: AgentTask
    endpoint: AgentEndpoint


@dataclass(frozen=True)
class ChildError:
    """What the agent raised (or why the child could not call it): the exception's type name, its
    message and the tail of its traceback."""

    type: str
    message: str
    traceback: str = ""


def job_to_json(job: Job) -> str:
    return json.dumps({"target": job.target, "task": asdict(job.task), "endpoint": asdict(job.endpoint)})


def job_from_json(text: str) -> Job:
    data = json.loads(text)
    task = dict(data["task"])
    task["sandbox"] = SandboxRules(**task.get("sandbox", {}))
    task["messages"] = tuple(task.get("messages", ()))
    task["tools"] = tuple(task.get("tools", ()))
    return Job(str(data["target"]), AgentTask(**task), AgentEndpoint(**data["endpoint"]))


def result_to_json(result: AgentResult) -> str:
    return json.dumps({"ok": True, "result": asdict(result)}, default=str)


def error_to_json(error: ChildError) -> str:
    return json.dumps({"ok": False, "error": asdict(error)})


def outcome_from_json(text: str) -> AgentResult | ChildError:
    """The child's answer; a ValueError when it is not one (a torn or foreign file)."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
        raise ValueError(f"not an agent outcome: {text[:200]!r}")
    if not data["ok"]:
        return ChildError(**data["error"])
    return as_result(data["result"])


def as_result(value: Any) -> AgentResult:
    """What an agent returned, as an :class:`AgentResult`: one already, or a mapping of its fields; a
    TypeError naming what it was otherwise."""
    if isinstance(value, AgentResult):
        return value
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"answer", "patch", "steps", "info"})
        if unknown:
            raise TypeError(f"an agent's result has no field(s) {unknown}; AgentResult has answer, patch, steps, info")
        for key in ("answer", "patch"):
            if value.get(key) is not None and not isinstance(value[key], str):
                raise TypeError(f"AgentResult.{key} must be a string or None, got {type(value[key]).__name__}")
        return AgentResult(**value)
    raise TypeError(f"an agent must return an AgentResult (or a dict of its fields), got {type(value).__name__}")
