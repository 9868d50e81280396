"""The capture proxy's counts over an evaluation's episodes, for ``summary.json`` and sao-eval's table.

An agent plug-in's episode records what its session of the capture proxy saw (``info["capture"]``,
written by :class:`~sao.agents.external.runner.ExternalAgentRunner`: ``calls``, ``stats`` as
:class:`~sao.agents.capture.CaptureStats`, ``segments``). :func:`capture_counts` sums the stats over the
episodes: served ``calls``, calls ``merged`` into the previous one, calls ``split`` into a new segment
(per reason in ``split_reasons``), ``pinned_calls`` (sampling settings overridden) and ``failed_calls``
(the upstream failed). ``episodes`` counts the records that carry stats; ``uncaptured`` those that do not
(the agent never started: the task could not be briefed, or a pass-through session captured nothing).

A run without an agent plug-in has no such counts: the summary leaves the key out rather than write zeros.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sao.agents import Trajectory
from sao.agents.capture import CaptureStats

SUMMARY_KEY = "capture"


@dataclass(frozen=True)
class CaptureCounts:
    """The sums over an evaluation's episodes (module doc): ``total`` sums the episodes' stats."""

    episodes: int = 0
    uncaptured: int = 0
    total: CaptureStats = field(default_factory=CaptureStats)

    def as_json(self) -> dict[str, Any]:
        """The summary's keys: ``episodes``, ``uncaptured`` and the total's counts beside them."""
        return {"episodes": self.episodes, "uncaptured": self.uncaptured, **self.total.as_json()}


def episode_stats(t: Trajectory) -> CaptureStats | None:
    """The capture stats an episode's record holds, or None when it holds none."""
    capture = t.info.get(SUMMARY_KEY)
    stats = capture.get("stats") if isinstance(capture, Mapping) else None
    return CaptureStats.from_json(stats) if isinstance(stats, Mapping) else None


def capture_counts(done: Iterable[Trajectory]) -> CaptureCounts:
    """The sums of the episodes' capture stats (module doc)."""
    found = [episode_stats(t) for t in done]
    held = [s for s in found if s is not None]
    return CaptureCounts(episodes=len(held), uncaptured=len(found) - len(held), total=sum(held, CaptureStats()))


def capture_summary(plugin: bool, done: Iterable[Trajectory]) -> dict[str, Any]:
    """What ``summary.json`` adds: the counts under :data:`SUMMARY_KEY` for a plug-in's run, nothing otherwise."""
    return {SUMMARY_KEY: capture_counts(done).as_json()} if plugin else {}


def capture_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """sao-eval's table rows for the counts in ``summary`` (none when it has none: no agent plug-in)."""
    counts = summary.get(SUMMARY_KEY)
    if not isinstance(counts, Mapping):
        return []
    reasons = ", ".join(f"{k} {v}" for k, v in counts.get("split_reasons", {}).items()) or "-"
    return [("captured calls", f"{counts['calls']} in {counts['episodes']} episode(s)"
             + (f", {counts['uncaptured']} uncaptured" if counts.get("uncaptured") else "")),
            ("calls merged / split", f"{counts['merged']} / {counts['split']}"),
            ("split reasons", reasons),
            ("calls pinned / failed", f"{counts['pinned_calls']} / {counts['failed_calls']}")]
