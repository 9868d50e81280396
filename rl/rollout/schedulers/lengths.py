"""Length distribution of generated, trained and dropped trajectories: is the learner biased to short ones?

DORA's C2 (METHOD.md 2) says no trajectory is dropped or cut because it is long. ``async`` with
``stale_policy=drop`` breaks it in a quiet way: a long trajectory finishes late, so it is the one
that is too stale, is dropped and its prompt re-sampled. This accumulator makes the bias
measurable, in the simulator and in a real run alike (lengths are action tokens):

* ``admitted``: every attempt started (only where its length is known at the start: the
  simulator draws it then; the unbiased reference, as short attempts finish first);
* ``generated``: every attempt that finished without failing (trained, dropped or still waiting);
* ``trained``: the attempts the learner took;
* ``dropped``: the attempts discarded for staleness.

``long`` means above ``long_tokens`` (default None: the median of everything generated so far,
recomputed at each report), one threshold for all sets, so their long shares are comparable; with
no bias the trained and generated shares agree (about 50% with the default threshold).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def quantile(sorted_values: list[int], q: float) -> float:
    """The ``q`` quantile by linear interpolation (0.0 for an empty list)."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class LengthSummary:
    """One set of lengths: count, mean, median, 90th percentile and share above ``long_tokens``."""

    n: int
    mean: float
    p50: float
    p90: float
    long_share: float

    @staticmethod
    def of(values: list[int], long_tokens: float) -> LengthSummary:
        s = sorted(values)
        n = len(s)
        return LengthSummary(n, sum(s) / n if n else 0.0, quantile(s, 0.5), quantile(s, 0.9),
                             sum(v > long_tokens for v in s) / n if n else 0.0)


@dataclass
class LengthStats:
    """Accumulates action-token lengths over the whole run (module docstring; the metrics are
    cumulative, not per step). ``long_tokens``: the threshold of ``long``; None: the median of
    what was generated so far."""

    long_tokens: float | None = None
    admitted: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)

    def on_admitted(self, n_tokens: int) -> None:
        self.admitted.append(n_tokens)

    def on_generated(self, n_tokens: int) -> None:
        self.generated.append(n_tokens)

    def on_trained(self, n_tokens: int) -> None:
        self.trained.append(n_tokens)

    def on_dropped(self, n_tokens: int) -> None:
        self.dropped.append(n_tokens)

    @property
    def threshold(self) -> float:
        """``long_tokens``, or the median of what was generated so far."""
        if self.long_tokens is not None:
            return self.long_tokens
        return quantile(sorted(self.generated), 0.5)

    def summaries(self) -> dict[str, LengthSummary]:
        t = self.threshold
        sets = (("admitted", self.admitted), ("generated", self.generated), ("trained", self.trained),
                ("dropped", self.dropped))
        return {name: LengthSummary.of(values, t) for name, values in sets if values or name != "admitted"}

    def state_dict(self) -> dict[str, list[int]]:
        """The lengths so far, for a resumed run to go on from (its metrics are the whole run's)."""
        return {"admitted": list(self.admitted), "generated": list(self.generated), "trained": list(self.trained),
                "dropped": list(self.dropped)}

    def load_state_dict(self, state: dict[str, list[int]]) -> None:
        for name in ("admitted", "generated", "trained", "dropped"):
            getattr(self, name)[:] = [int(v) for v in state.get(name, [])]

    def metrics(self) -> dict[str, float]:
        """Namespaced metrics for a step's metrics dict: ``rollout/len_{set}_{stat}`` for set in
        generated, trained, dropped (and admitted when recorded) and stat in n, mean, p50, p90,
        long_share; ``rollout/len_long_tokens``;
        ``rollout/len_trained_bias`` = mean trained / mean generated - 1 (negative: short-biased)."""
        out: dict[str, float] = {"rollout/len_long_tokens": float(self.threshold)}
        sums = self.summaries()
        for name, s in sums.items():
            out[f"rollout/len_{name}_n"] = float(s.n)
            for stat in ("mean", "p50", "p90", "long_share"):
                out[f"rollout/len_{name}_{stat}"] = float(getattr(s, stat))
        g, tr = sums["generated"].mean, sums["trained"].mean
        out["rollout/len_trained_bias"] = tr / g - 1.0 if g and sums["trained"].n else 0.0
        return out
