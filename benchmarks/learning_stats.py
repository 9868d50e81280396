"""The statistics of the learning benchmark (benchmarks/learning_arithmetic.py), pure functions of the runs'
held-out records (``{step: {task_id: correct}}``, as ``sao.rl.training.heldout.load_results`` gives): the mean
curve over seeds, each run's improvement, and their intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sao.rl.training.heldout import Interval, paired_difference, wilson_interval

# t_{0.975, df} for df = 1..30 (two-sided 95%); beyond 30 the normal quantile is within 2%
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def t_quantile(df: int) -> float:
    """t_{0.975, df}; the normal quantile beyond the table."""
    if df < 1:
        return math.nan
    return T975[df - 1] if df <= len(T975) else 1.959963984540054


def t_interval(values: Sequence[float]) -> Interval:
    """Mean with a 95% t-interval (``mean +- t_{0.975, n-1} sd / sqrt(n)``); NaN bounds for n < 2."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, math.nan, math.nan)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half)


@dataclass(frozen=True)
class CurvePoint:
    """Held-out accuracy of one algorithm at one evaluation step, over its seeds."""

    step: int
    per_seed: tuple[float, ...]  # each seed's accuracy
    pooled: Interval  # Wilson over the correct answers summed across seeds x problems
    n: int  # problems x seeds

    @property
    def mean(self) -> float:
        return sum(self.per_seed) / len(self.per_seed)


def curve(runs: Sequence[dict[int, dict[str, bool]]]) -> list[CurvePoint]:
    """The mean curve over seeds (each ``{step: {task_id: correct}}``, as ``load_results`` gives), at
    the steps every seed evaluated."""
    if not runs:
        return []
    steps = sorted(set.intersection(*(set(r) for r in runs)))
    out = []
    for step in steps:
        k = sum(sum(r[step].values()) for r in runs)
        n = sum(len(r[step]) for r in runs)
        out.append(CurvePoint(step, tuple(sum(r[step].values()) / len(r[step]) for r in runs),
                              wilson_interval(k, n), n))
    return out


def paired_lists(results: dict[int, dict[str, bool]]) -> tuple[list[bool], list[bool]]:
    """(first, last) evaluation of one run on the problems both share; empty with fewer than two."""
    if len(results) < 2:
        return [], []
    first, last = results[min(results)], results[max(results)]
    shared = sorted(set(first) & set(last))
    return [first[t] for t in shared], [last[t] for t in shared]


@dataclass(frozen=True)
class Improvement:
    """last - first held-out accuracy: per seed, the mean over seeds (t-interval), and pooled."""

    per_seed: tuple[float, ...]
    over_seeds: Interval
    pooled: Interval


def improvement_stats(runs: Sequence[dict[int, dict[str, bool]]]) -> Improvement | None:
    """The improvement of each run from its first to its last evaluation (module doc); runs with
    fewer than two evaluations are left out; None when none has two."""
    pairs = [paired_lists(r) for r in runs]
    pairs = [(b, a) for b, a in pairs if b]
    if not pairs:
        return None
    per_seed = tuple(paired_difference(b, a).value for b, a in pairs)
    before = [x for b, _ in pairs for x in b]
    after = [x for _, a in pairs for x in a]
    return Improvement(per_seed, t_interval(per_seed), paired_difference(before, after))


COLLAPSE_DROP = 0.10  # issue "8 of 9": collapse = held-out accuracy more than 10 points below the run's own start


def collapsed(results: dict[int, dict[str, bool]], drop: float = COLLAPSE_DROP) -> bool:
    """Whether any evaluation after the first fell more than ``drop`` below the first (the run's own
    start), on the problems both share. A run with one evaluation has not collapsed (yet)."""
    if len(results) < 2:
        return False
    first = results[min(results)]
    for step in sorted(results)[1:]:
        shared = set(first) & set(results[step])
        if shared and (sum(results[step][t] for t in shared) - sum(first[t] for t in shared)) / len(shared) < -drop:
            return True
    return False


@dataclass(frozen=True)
class ArmDifference:
    """Improvement of arm A minus that of arm B, seed by seed (the same seed: the same held-out problems,
    the same prompt order), with a t-interval over seeds (the headline) and, beside it, a normal interval
    over the pooled per-problem differences ``(a_last - a_first) - (b_last - b_first)``."""

    seeds: tuple[int, ...]
    per_seed: tuple[float, ...]
    over_seeds: Interval
    pooled: Interval


def arm_difference(a: dict[int, dict[int, dict[str, bool]]], b: dict[int, dict[int, dict[str, bool]]]
                   ) -> ArmDifference | None:
    """``a`` and ``b`` map seed -> a run's records. Only the seeds where both runs have two evaluations
    count, and per seed only the problems all four evaluations share. None when no seed counts."""
    seeds, per_seed, pooled = [], [], []
    for seed in sorted(set(a) & set(b)):
        ra, rb = a[seed], b[seed]
        if len(ra) < 2 or len(rb) < 2:
            continue
        ends = (ra[min(ra)], ra[max(ra)], rb[min(rb)], rb[max(rb)])
        shared = sorted(set.intersection(*(set(e) for e in ends)))
        if not shared:
            continue
        d = [(ends[1][t] - ends[0][t]) - (ends[3][t] - ends[2][t]) for t in shared]
        seeds.append(seed)
        per_seed.append(sum(d) / len(d))
        pooled += d
    if not seeds:
        return None
    n = len(pooled)
    mean = sum(pooled) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in pooled) / (n - 1)) if n > 1 else math.nan
    half = 1.959963984540054 * sd / math.sqrt(n)
    return ArmDifference(tuple(seeds), tuple(per_seed), t_interval(per_seed), Interval(mean, mean - half, mean + half))
