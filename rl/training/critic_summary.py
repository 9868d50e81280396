"""A run's critic in a few numbers: the mean explained variance over the steps where it is defined.

``value/explained_var`` (pooled over action tokens) and ``value/explained_var_first`` (at each
trajectory's first action token, :mod:`sao.rl.learner.explained_variance`) are NaN -- ``null`` in
``metrics.jsonl`` -- at a step whose returns are all equal. One step's value is noisy (8 trajectories
in the default run), so the summary averages the defined steps of two windows of policy steps:

- the second half of the run (steps after ``last_step / 2``);
- the last ``window`` steps (8).

Each window says how many of its steps were defined; a mean over fewer than ``min_defined`` (6)
is flagged as too few to judge. ``sao-train`` logs it at the end of a run with a critic, beside the
held-out summary; ``sao-report`` prints it for each run; :func:`critic_summary_of` reads it from a run
folder for benchmarks and tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.rl.training.metrics_log import read_jsonl

EV_KEYS = ("value/explained_var", "value/explained_var_first")


@dataclass(frozen=True)
class WindowMean:
    """The mean of one metric over the policy steps ``first_step..last_step``: ``steps`` logged,
    ``defined`` of them with a number, ``mean`` over those (None when none is defined)."""

    name: str
    first_step: int
    last_step: int
    steps: int
    defined: int
    mean: float | None

    def describe(self, min_defined: int) -> str:
        value = "undefined" if self.mean is None else f"{self.mean:+.3f}"
        short = f" (fewer than {min_defined}: too few to judge)" if self.defined < min_defined else ""
        return (f"{self.name} (steps {self.first_step}-{self.last_step}) {value} over {self.defined} of "
                f"{self.steps} defined steps{short}")


@dataclass(frozen=True)
class CriticSummary:
    """One explained-variance key's windows (module doc)."""

    key: str
    second_half: WindowMean
    last: WindowMean
    min_defined: int

    def describe(self) -> str:
        return (f"{self.key}: {self.second_half.describe(self.min_defined)}; "
                f"{self.last.describe(self.min_defined)}")


def _window(name: str, rows: list[tuple[int, Any]]) -> WindowMean:
    numbers = [float(v) for _, v in rows if isinstance(v, (int, float)) and math.isfinite(v)]
    steps = [s for s, _ in rows]
    return WindowMean(name, min(steps), max(steps), len(rows), len(numbers),
                      sum(numbers) / len(numbers) if numbers else None)


def critic_summary(rows: list[dict[str, Any]], *, window: int = 8, min_defined: int = 6) -> list[CriticSummary]:
    """The summary of each of :data:`EV_KEYS` that some policy step (``step >= 1``) of ``rows`` (the
    lines of ``metrics.jsonl``) carries; empty for a run without a critic. A step logged twice (it
    should not be) counts once, its last line."""
    by_step = {int(r["step"]): r for r in rows if isinstance(r.get("step"), int) and r["step"] >= 1}
    steps = sorted(by_step)
    out = []
    for key in EV_KEYS:
        if not any(key in by_step[s] for s in steps):
            continue
        pairs = [(s, by_step[s].get(key)) for s in steps]
        half = steps[-1] / 2
        out.append(CriticSummary(key, _window("second half", [p for p in pairs if p[0] > half]),
                                 _window(f"last {window}", pairs[-window:]), min_defined))
    return out


def critic_summary_of(run: Path, **kwargs: int) -> list[CriticSummary]:
    """:func:`critic_summary` of a run folder's ``metrics.jsonl`` (or of that file itself)."""
    run = Path(run)
    return critic_summary(read_jsonl(run / "metrics.jsonl" if run.is_dir() else run), **kwargs)
