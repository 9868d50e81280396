"""Generated arithmetic: seeded, endless, with a ``difficulty`` knob for curricula.

A task is one binary operation ``a OP b`` with OP in ``+ - * /`` and operands of ``d`` digits.
Division tasks are built as ``(b*q) / b`` so every answer is an integer.

``difficulty`` in [0, 1] maps linearly onto a digit *level* in ``[1, max_digits]``; a fractional
level mixes its two neighbouring digit counts (level 2.25 draws 2-digit operands 75% of the time
and 3-digit ones 25%), so a scheduler can drift difficulty smoothly.

A task id names everything needed to rebuild the task (``mul-d3-s0-i17``: operation,
digits, seed, index), so ``reset(options={"task_id": ...})`` works whatever the knob is set to now.

Held-out problems: ``split="train"`` or ``"test"`` partitions the problem space itself, not the
stream: a problem (its operation and operands) is a test problem when a hash of its text falls in
the lowest ``test_frac`` of the range, whatever seed or index drew it. A split's stream redraws
(with a salted generator) until the problem is in its split, so no test problem is ever drawn for
training, even where the space is small enough (1-2 digits) for streams to repeat problems. Split
ids carry the split (``add-d2-s0-i17-test``); ``split="all"`` (the default) is the unsplit stream.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np

from .errors import TaskError
from .math_envs import MathEnv, MathTask

OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
SYMBOL = {name: sym for sym, name in OPS.items()}
_ID = re.compile(r"^(add|sub|mul|div)-d([1-9]\d*)-s(\d+)-i(\d+)(?:-(train|test))?$")
SPLITS = ("all", "train", "test")
DEFAULT_TEST_FRAC = 0.2
_MAX_REDRAWS = 10_000


def in_test_split(problem: str, test_frac: float = DEFAULT_TEST_FRAC) -> bool:
    """Whether ``problem`` (its text, e.g. ``"What is 3 + 4?"``) is a held-out problem."""
    return zlib.crc32(problem.encode()) % 1_000_000 < round(test_frac * 1_000_000)


def _operands(op: str, digits: int, seed: int, index: int, salt: int) -> tuple[str, int]:
    key = [seed, index, digits, "+-*/".index(SYMBOL[op])] + ([salt] if salt else [])
    rng = np.random.default_rng(key)
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits
    a, b = int(rng.integers(lo, hi)), int(rng.integers(max(lo, 1), hi))
    if op == "add":
        result = a + b
    elif op == "sub":
        result = a - b
    elif op == "mul":
        result = a * b
    else:  # div: a = b * q
        q = int(rng.integers(max(lo, 1), hi))
        a, result = b * q, q
    return f"What is {a} {SYMBOL[op]} {b}?", result


def make_task(op: str, digits: int, seed: int, index: int, split: str = "all",
              test_frac: float = DEFAULT_TEST_FRAC) -> MathTask:
    """The task with this id's parts; pure and deterministic. ``split`` "train"/"test": the first
    salted draw whose problem lies in that split (module doc)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    for salt in range(_MAX_REDRAWS):
        problem, result = _operands(op, digits, seed, index, salt)
        if split == "all" or in_test_split(problem, test_frac) == (split == "test"):
            break
    else:
        raise ValueError(f"no {split} problem for {op} with {digits} digit(s) at test_frac {test_frac}")
    task_id = f"{op}-d{digits}-s{seed}-i{index}" + ("" if split == "all" else f"-{split}")
    return MathTask(task_id, problem, str(result), family=op, meta={"digits": digits})


class ArithmeticTasks:
    """An endless task source. ``ids(limit)`` lists the first ``limit`` tasks of the seed's stream."""

    endless = True

    def __init__(self, seed: int = 0, difficulty: float = 0.0, ops: str = "+-*/", max_digits: int = 4,
                 split: str = "all", test_frac: float = DEFAULT_TEST_FRAC):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if not 0.0 < test_frac < 1.0:
            raise ValueError(f"test_frac must be in (0, 1), got {test_frac}")
        self.split, self.test_frac = split, test_frac
        bad = sorted(set(ops) - set(OPS))
        if bad or not ops:
            raise ValueError(f"ops must be a non-empty string over '+-*/', got {ops!r}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if max_digits < 1:
            raise ValueError(f"max_digits must be >= 1, got {max_digits}")
        self.seed, self.ops, self.max_digits = seed, ops, max_digits
        self.difficulty = 0.0
        self.set_difficulty(difficulty)

    def set_difficulty(self, difficulty: float) -> None:
        if not 0.0 <= difficulty <= 1.0:
            raise ValueError(f"difficulty must be in [0, 1], got {difficulty}")
        self.difficulty = float(difficulty)

    def _draw(self, rng: np.random.Generator, index: int) -> MathTask:
        level = 1.0 + self.difficulty * (self.max_digits - 1)
        digits = int(level) + int(rng.random() < level - int(level))
        op = OPS[self.ops[int(rng.integers(len(self.ops)))]]
        return make_task(op, min(digits, self.max_digits), self.seed, index, self.split, self.test_frac)

    def ids(self, limit: int | None = None) -> list[str]:
        if limit is None:
            raise ValueError("arithmetic is endless: pass a limit (e.g. --limit 100)")
        return [self._draw(np.random.default_rng([self.seed, i]), i).task_id for i in range(limit)]

    def get(self, task_id: str) -> MathTask:
        m = _ID.match(task_id)
        if not m:
            raise TaskError(f"not an arithmetic task id: {task_id!r} (expected e.g. 'add-d2-s0-i17')")
        return make_task(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5) or "all",
                         self.test_frac)

    def sample(self, rng: np.random.Generator) -> MathTask:
        index = int(rng.integers(2**31))
        return self._draw(rng, index)


def arithmetic(
    seed: int = 0, difficulty: float = 0.0, ops: str = "+-*/", max_digits: int = 4, split: str = "all",
    test_frac: float = DEFAULT_TEST_FRAC, **kwargs: Any
) -> MathEnv:
    """Endless arithmetic. ``env.unwrapped.tasks.set_difficulty(x)`` moves the curriculum; ``split``
    "train" / "test" keeps held-out problems apart (module doc)."""
    kwargs.setdefault("instruction", "Put your final answer within \\boxed{}.")
    return MathEnv(ArithmeticTasks(seed, difficulty, ops, max_digits, split, test_frac), integer_answers=True,
                   **kwargs)
