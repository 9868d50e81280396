"""Scores over per-task sample outcomes."""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with ``n`` samples of which ``c`` are correct (Chen et al., 2021).

    ``1 - C(n - c, k) / C(n, k)``: the chance that k samples drawn without replacement from the n
    include at least one correct one.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks_for(n: int) -> list[int]:
    """The k reported for n samples per task: powers of two below n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def mean_pass_at_k(outcomes: Sequence[Sequence[bool]]) -> dict[str, float]:
    """pass@k averaged over tasks, for every k in :func:`ks_for` of the smallest sample count."""
    if not outcomes:
        return {}
    n = min(len(o) for o in outcomes)
    if n == 0:
        return {}
    return {str(k): sum(pass_at_k(len(o), sum(o), k) for o in outcomes) / len(outcomes) for k in ks_for(n)}
