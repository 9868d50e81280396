"""Held-out evaluation during training: accuracy on problems the run never trains on, with intervals.

    before step 1, every ``eval.every`` steps, and after the last step:
        accuracy = mean(correct) over the same ``eval.problems`` held-out tasks, one greedy episode each
    at the end: the paired difference (last - first) on those tasks, with a 95% interval

The held-out tasks are the first ``eval.problems`` task ids of the training environment built with
``eval.kwargs`` merged over ``env.kwargs`` (for arithmetic: ``split: test``, while training draws
``split: train``, so no held-out problem is ever trained on). The same tasks are evaluated every
time, so successive accuracies are paired and their difference has a tighter interval than two
independent samples would give. Each evaluation appends one line per task to ``RUN_DIR/eval.jsonl``
(step, task id, correct, answer, status, and the episode's ``turns``: each message of its transcript with
its role and text, and an action's tool calls, so a reader sees a tool call in one turn and the answer in
a later one), the record the final difference is computed from, also after a resume.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.agents import ChatRenderer, CompletionClient, EpisodeRunner, LoopConfig, Trajectory
from sao.agents.loop import task_seed
from sao.envs import make
from sao.rl.training.metrics_log import read_jsonl

Z95 = 1.959963984540054  # the two-sided 95% normal quantile


@dataclass(frozen=True)
class Interval:
    """An estimate with a 95% interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def wilson_interval(successes: int, n: int, z: float = Z95) -> Interval:
    """The Wilson score interval of a binomial proportion (well-behaved near 0 and 1, unlike Wald's)."""
    if n <= 0:
        return Interval(math.nan, math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


def paired_difference(before: Sequence[bool], after: Sequence[bool], z: float = Z95) -> Interval:
    """Mean of ``after - before`` over the same tasks, with a normal 95% interval on the paired
    differences (each in {-1, 0, 1}): ``d +- z * sd(d) / sqrt(n)``."""
    if len(before) != len(after):
        raise ValueError(f"paired samples differ in length ({len(before)} vs {len(after)})")
    n = len(before)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    diffs = [float(a) - float(b) for a, b in zip(after, before)]
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    half = z * math.sqrt(var / n)
    return Interval(mean, mean - half, mean + half)


@dataclass(frozen=True)
class EpisodeTurn:
    """One message of a held-out episode's transcript, as ``eval.jsonl`` records it: the user's problem, an
    action (the model's text; ``tool_calls``: the calls parsed from it, ``{"name", "arguments"}``), or an
    observation (a ``tool`` message: the tool's output)."""

    role: str
    text: str
    tool_calls: tuple[dict[str, Any], ...] = ()

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "text": self.text}
        if self.tool_calls:
            out["tool_calls"] = list(self.tool_calls)
        return out


def episode_turns(trajectory: Trajectory) -> tuple[EpisodeTurn, ...]:
    """The transcript of ``trajectory`` as :class:`EpisodeTurn` s (the renderer's system prompt, the same for
    every episode, is not among its messages)."""
    turns = []
    for m in trajectory.messages:
        calls = tuple({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                      for c in m.get("tool_calls") or ())
        content = m.get("content")
        turns.append(EpisodeTurn(str(m.get("role")), content if isinstance(content, str) else str(content or ""),
                                 calls))
    return tuple(turns)


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: per task, whether the greedy answer was correct."""

    step: int
    task_ids: tuple[str, ...]
    correct: tuple[bool, ...]
    truncated: int
    failed: int
    wall_s: float
    samples: tuple[Trajectory, ...] = field(default=(), repr=False, compare=False)  # the episodes, in task order

    @property
    def accuracy(self) -> Interval:
        return wilson_interval(sum(self.correct), len(self.correct))

    def metrics(self) -> dict[str, float]:
        """Accuracy with its interval, and per episode (over the samples) model calls and tool calls."""
        acc = self.accuracy
        n = max(len(self.samples), 1)
        per_episode = {"eval/turns_mean": sum(len(t.turns) for t in self.samples) / n,
                       "eval/tool_calls_mean": sum(t.num_tool_calls for t in self.samples) / n} if self.samples else {}
        return {"eval/accuracy": acc.value, "eval/accuracy_low": acc.low, "eval/accuracy_high": acc.high,
                "eval/n": float(len(self.correct)), "eval/truncated": float(self.truncated),
                "eval/failed": float(self.failed), **per_episode, "perf/eval_s": self.wall_s}


def distinct_tasks(env_name: str, env_kwargs: dict[str, Any], problems: int) -> tuple[str, ...]:
    """The first ``problems`` task ids of the env whose first observations differ: a small problem
    space (1-digit arithmetic) repeats problems under different ids, and a repeated problem is the
    same greedy answer counted twice, which would shrink the intervals without adding evidence.
    An endless env is scanned further until enough distinct problems are found (or 50 x as many
    ids were seen); a finite one gives what it has."""
    env = make(env_name, **env_kwargs)
    try:
        base = env.unwrapped
        endless = bool(getattr(base, "endless", False))
        seen: set[str] = set()
        out: list[str] = []
        scanned, limit = 0, problems
        while len(out) < problems:
            ids = list(base.task_ids(limit if endless else None))  # a stable prefix of the env's stream
            for task_id in ids[scanned:]:
                scanned += 1
                obs, _ = env.reset(options={"task_id": task_id})
                key = json.dumps(obs, sort_keys=True, default=str)
                if key not in seen:
                    seen.add(key)
                    out.append(task_id)
                    if len(out) == problems:
                        break
            if not endless or limit >= 50 * problems:
                break
            limit *= 2
        return tuple(out)
    finally:
        env.close()


class HeldOutEval:
    """Runs the held-out evaluation (module doc) against one engine client."""

    def __init__(self, *, client: CompletionClient, renderer_for: Callable[[tuple[dict[str, Any], ...]], ChatRenderer],
                 env_name: str, env_kwargs: dict[str, Any], loop: LoopConfig, problems: int, concurrency: int,
                 path: Path, runner: Any = None, seed: int = 0):
        # runner: who plays an episode on the client (None: the project's loop; an agent plug-in's player)
        self.client, self.runner = client, runner or EpisodeRunner(env_name, renderer_for, loop, env_kwargs)
        # each task's own sampling seed (task_seed: the run's seed and the task's id), the same at every step, so
        # that two evaluations of a sampled run (eval.temperature > 0) pair each problem with itself; one
        # seed for every task would draw the same random numbers for all of them, and at a first token whose
        # distribution hardly depends on the problem, one unlucky draw failed 99 of 100 problems at once
        self.seed = seed
        self.concurrency, self.path = concurrency, Path(path)
        self.task_ids = distinct_tasks(env_name, env_kwargs, problems)
        if not self.task_ids:
            raise ValueError(f"{env_name} with {env_kwargs} has no held-out tasks")

    async def run(self, step: int) -> EvalResult:
        """Evaluate every held-out task once on the engine's current weights; append to eval.jsonl."""
        semaphore = asyncio.Semaphore(self.concurrency)

        async def one(task_id: str) -> Trajectory:
            async with semaphore:
                return await self.runner(self.client, task_id=task_id, seed=task_seed(self.seed, task_id, 0))

        t0 = time.monotonic()
        done = await asyncio.gather(*(one(t) for t in self.task_ids))
        result = EvalResult(step, self.task_ids, tuple(t.status == "ok" and t.correct for t in done),
                            sum(t.truncated for t in done), sum(t.status != "ok" for t in done), time.monotonic() - t0,
                            tuple(done))
        with self.path.open("a", encoding="utf-8") as fh:
            for t, ok in zip(done, result.correct):
                fh.write(json.dumps({"step": step, "task_id": t.task_id, "correct": ok, "answer": t.info.get("answer"),
                                     "status": t.status, "error": t.error,
                                     "turns": [x.row() for x in episode_turns(t)]}) + "\n")
        return result


def load_results(path: Path) -> dict[int, dict[str, bool]]:
    """``eval.jsonl`` as {step: {task_id: correct}} (a torn last line is skipped)."""
    out: dict[int, dict[str, bool]] = {}
    for row in read_jsonl(path):
        out.setdefault(int(row["step"]), {})[row["task_id"]] = bool(row["correct"])
    return out


def improvement(path: Path) -> tuple[int, int, Interval, Interval, Interval] | None:
    """(first step, last step, first accuracy, last accuracy, paired difference) over the tasks both
    evaluations share; None with fewer than two evaluations."""
    results = load_results(path)
    if len(results) < 2:
        return None
    first, last = min(results), max(results)
    shared = sorted(set(results[first]) & set(results[last]))
    before = [results[first][t] for t in shared]
    after = [results[last][t] for t in shared]
    return (first, last, wilson_interval(sum(before), len(before)), wilson_interval(sum(after), len(after)),
            paired_difference(before, after))
