"""Math environments: BeyondAIME, IMO-AnswerBench (v2) and a generated arithmetic curriculum.

One class, :class:`MathEnv`, serves all three; they differ in their task source and in whether
answers are integers (which enables the last-number extraction fallback). An episode is one
question and one answer by default; ``feedback_turns=N`` lets the environment tell the agent
that its answer was missing or wrong and ask again up to N times (a multi-turn variant that the
learner can train on).

``tools="python"`` offers a ``python`` tool (:class:`~sao.envs.python_tool.PythonTool`): each call runs
the code in a fresh process of a sandbox (``sandbox="local"``: :class:`~sao.sandboxes.LocalSandbox`,
bubblewrap-isolated, an error where bubblewrap is not usable unless ``SAO_SANDBOX_UNISOLATED=1``;
``"docker"``: a :class:`~sao.sandboxes.DockerSandbox` on the base
image, no network).
Its output (truncated), a non-zero exit status, a timeout, or a malformed call comes back as a
``tool`` message; a message without tool calls is the final answer and is graded.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sao.hints import did_you_mean
from sao.sandboxes import require_isolation

from .capabilities import Policy
from .core import Message, TextEnv
from .datasets import load_rows, require_fields
from .errors import DatasetError, TaskError
from .grading import extract_answer, grade
from .python_tool import PYTHON_TOOL, SANDBOXES, PythonTool

BEYOND_AIME_SOURCE = "ByteDance-Seed/BeyondAIME"
# IMO-AnswerBench has no official hub dataset; upstream publishes the CSV in its repository.
IMO_ANSWERBENCH_SOURCE = (
    "https://raw.githubusercontent.com/google-deepmind/superhuman/main/imobench/answerbench_v2.csv"
)
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TOOLS = {"python": PYTHON_TOOL}


@dataclass(frozen=True)
class MathTask:
    task_id: str
    problem: str
    answer: str
    family: str = "math"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


class TaskSource(Protocol):
    def ids(self, limit: int | None = None) -> list[str]: ...
    def get(self, task_id: str) -> MathTask: ...
    def sample(self, rng: np.random.Generator) -> MathTask: ...


class TaskList:
    """A finite task list (a benchmark)."""

    def __init__(self, tasks: Sequence[MathTask], name: str = "tasks"):
        if not tasks:
            raise DatasetError(f"{name}: no tasks")
        self.name = name
        self._tasks = tuple(tasks)
        self._by_id = {t.task_id: t for t in self._tasks}
        if len(self._by_id) != len(self._tasks):
            twice = next(i for i, n in Counter(t.task_id for t in self._tasks).items() if n > 1)
            raise DatasetError(f"{name}: duplicate task id {twice!r}; each task needs its own id")

    def __len__(self) -> int:
        return len(self._tasks)

    def ids(self, limit: int | None = None) -> list[str]:
        return [t.task_id for t in self._tasks[:limit]]

    def get(self, task_id: str) -> MathTask:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise TaskError(
                f"{self.name}: no task {task_id!r}.{did_you_mean(task_id, list(self._by_id))}"
            ) from None

    def sample(self, rng: np.random.Generator) -> MathTask:
        return self._tasks[int(rng.integers(len(self._tasks)))]


def baseline_policy(env: MathEnv, name: str, task_id: str) -> Policy:
    """A model-free agent (the math environments' :class:`~sao.envs.capabilities.ScriptedPolicies`):
    ``gold`` answers the reference in ``\\boxed{}``, ``empty`` answers nothing."""
    if name not in ("gold", "empty"):
        raise ValueError(f"unknown scripted agent {name!r}; this environment has 'gold' and 'empty'")
    text = f"\\boxed{{{env.tasks.get(task_id).answer}}}" if name == "gold" else ""
    return lambda observation, info: {"role": "assistant", "content": text}


def grade_answer(env: MathEnv, task_id: str, answer: str) -> dict[str, Any]:
    """Grade a given answer to ``task_id`` with the environment's own checker (the math environments'
    :class:`~sao.envs.capabilities.PredictionGrader`; an external agent's answer). The answer is taken
    from ``answer`` as from a model's reply (the last ``\\boxed{}``, an "Answer:" statement, for integer
    answers the last number); a bare answer without them ("x + 1") is the answer itself. Blank: no
    answer, graded wrong. Returns the final ``info`` an episode ends with."""
    task = env.tasks.get(task_id)
    text = answer if isinstance(answer, str) else ""
    pred = extract_answer(text, integer=env.integer_answers)
    if pred is None and text.strip():
        pred = text.strip()
    result = grade(pred, task.answer, integer=env.integer_answers)
    return {"task_id": task.task_id, "family": task.family, "correct": result.correct, "answer": pred,
            "gold": task.answer, "graded_by": result.method, "attempts": 1 if pred is not None else 0,
            "error": None, "exit_status": "grade_only"}


class MathEnv(TextEnv):
    """Answer a math question; reward 1 if the final answer is equivalent to the reference."""

    scripted_policies = staticmethod(baseline_policy)  # `--agent gold|empty` (sao.envs.capabilities)
    prediction_grader = staticmethod(grade_answer)  # an external agent's answer (sao.envs.capabilities)

    def __init__(
        self,
        tasks: TaskSource,
        *,
        integer_answers: bool = False,
        system_prompt: str | None = None,
        instruction: str = INSTRUCTION,
        feedback_turns: int = 0,
        tools: str | None = None,
        sandbox: str = "local",
        tool_timeout_s: float = 10.0,
        tool_output_chars: int = 4000,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if feedback_turns < 0:
            raise ValueError(f"feedback_turns must be >= 0, got {feedback_turns}")
        if tools not in (None, "", *TOOLS):
            raise ValueError(f"tools must be one of {sorted(TOOLS)} (or None), got {tools!r}")
        if sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {SANDBOXES}, got {sandbox!r}")
        self.tools = (TOOLS[tools],) if tools else ()
        if self.tools and sandbox == "local":
            require_isolation()  # at construction: no episode runs the model's code unisolated by default
        self.python_tool = PythonTool(sandbox, timeout_s=tool_timeout_s, output_chars=tool_output_chars)
        self.tasks = tasks
        self.endless = bool(getattr(tasks, "endless", False))
        self.integer_answers = integer_answers
        self.system_prompt = system_prompt
        self.instruction = instruction
        self.feedback_turns = feedback_turns
        self.task: MathTask | None = None
        self._attempts = 0

    def task_ids(self, limit: int | None = None) -> list[str]:
        return self.tasks.ids(limit)

    def _begin(self, task_id: str | None) -> tuple[list[Message], dict[str, Any]]:
        self.task = self.tasks.sample(self.np_random) if task_id is None else self.tasks.get(task_id)
        self._attempts = 0
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        content = f"{self.task.problem}\n\n{self.instruction}" if self.instruction else self.task.problem
        messages.append({"role": "user", "content": content})
        info = {"task_id": self.task.task_id, "family": self.task.family}
        if self.tools:  # where the tool's code runs: an external agent's own python tool runs it there too
            info["tool_sandbox"] = self.python_tool.sandbox_kind
        return messages, info

    def _respond(self, action: Message):
        assert self.task is not None
        if self.tools and (action.get("tool_calls") or action.get("invalid_tool_calls")):
            return self._run_tools(action), 0.0, False, False, {"task_id": self.task.task_id,
                                                                 "family": self.task.family}
        self._close_sandbox()
        self._attempts += 1
        text = action.get("content") or ""
        pred = extract_answer(text, integer=self.integer_answers)
        result = grade(pred, self.task.answer, integer=self.integer_answers)
        if result.correct or self._attempts > self.feedback_turns:
            info = {
                "task_id": self.task.task_id,
                "family": self.task.family,
                "correct": result.correct,
                "answer": pred,
                "gold": self.task.answer,
                "graded_by": result.method,
                "attempts": self._attempts,
                "error": None,
            }
            return [], float(result.correct), True, False, info
        if pred is None:
            hint = "I could not find a final answer. Put your final answer within \\boxed{}."
        else:
            hint = f"Your answer {pred} is not correct. Check your work and give a final answer within \\boxed{{}}."
        info = {"task_id": self.task.task_id, "family": self.task.family, "answer": pred}
        return [{"role": "user", "content": hint}], 0.0, False, False, info

    # -- the python tool ---------------------------------------------------------------------
    def _run_tools(self, action: Message) -> list[Message]:
        out: list[Message] = [{"role": "tool", "content": f"Error: {e}"} for e in action.get("invalid_tool_calls", ())]
        for call in action.get("tool_calls") or ():
            fn = call["function"]
            content = self._python(fn) if fn["name"] == "python" else (
                f"Error: unknown tool {fn['name']!r}; the only tool is 'python'")
            out.append({"role": "tool", "tool_call_id": call.get("id"), "name": fn["name"], "content": content})
        return out

    def _python(self, fn: dict[str, Any]) -> str:
        try:
            code = json.loads(fn["arguments"]).get("code")
        except (json.JSONDecodeError, AttributeError):
            code = None
        if not isinstance(code, str) or not code.strip():
            return 'Error: the python tool needs {"code": "<program>"}'
        return self.python_tool.run(code)

    def _close_sandbox(self) -> None:
        self.python_tool.close()

    def close(self) -> None:
        self._close_sandbox()
        super().close()


# -- benchmarks ---------------------------------------------------------------------------------


def _cache_key(source: str) -> tuple[str, float]:
    path = Path(source).expanduser()
    return (str(path.resolve()), path.stat().st_mtime) if path.exists() else (source, 0.0)


@functools.lru_cache(maxsize=16)
def _beyond_aime_tasks(source: str, split: str, _stamp: float) -> TaskList:
    rows = load_rows(source, split=split)
    if not rows:
        raise DatasetError(f"{source}: no rows")
    # The hub dataset calls the question `problem`; some public copies call it `question`.
    problem_field = next((f for f in ("problem", "question", "Problem", "Question") if f in rows[0]), "problem")
    require_fields(rows, (problem_field, "answer"), source=source)
    tasks = [
        MathTask(str(r.get("id") or f"beyond-aime-{i:03d}"), str(r[problem_field]).strip(), str(r["answer"]).strip())
        for i, r in enumerate(rows)
    ]
    return TaskList(tasks, name=source)


@functools.lru_cache(maxsize=16)
def _answerbench_tasks(source: str, split: str, _stamp: float) -> TaskList:
    rows = load_rows(source, split=split)
    if not rows:
        raise DatasetError(f"{source}: no rows")
    require_fields(rows, ("Problem ID", "Problem", "Short Answer"), source=source)
    tasks = [
        MathTask(
            str(r["Problem ID"]).strip(),
            str(r["Problem"]).strip(),
            str(r["Short Answer"]).strip(),
            family=str(r.get("Category") or "math"),
        )
        for r in rows
    ]
    return TaskList(tasks, name=source)


def beyond_aime(data: str | os.PathLike | None = None, split: str = "test", **kwargs: Any) -> MathEnv:
    """BeyondAIME: 100 problems with integer answers (hub ``ByteDance-Seed/BeyondAIME``, or ``data``)."""
    source = str(data or BEYOND_AIME_SOURCE)
    return MathEnv(_beyond_aime_tasks(source, split, _cache_key(source)[1]), integer_answers=True, **kwargs)


def imo_answerbench(data: str | os.PathLike | None = None, split: str = "test", **kwargs: Any) -> MathEnv:
    """IMO-AnswerBench v2: 400 problems whose answers are numbers, expressions, sets or phrases."""
    source = str(data or IMO_ANSWERBENCH_SOURCE)
    return MathEnv(_answerbench_tasks(source, split, _cache_key(source)[1]), integer_answers=False, **kwargs)
