"""Append-only JSONL of trajectories, written as each episode finishes.

One line per episode, flushed and fsynced before the writer returns, so a crash loses at most the
episodes still running. A run killed in the middle of a write leaves a partial last line;
:class:`TrajectoryWriter` cuts it off before appending and :func:`read_trajectories` ignores it,
so a resumed run neither loses nor duplicates an episode.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .records import Trajectory

log = logging.getLogger(__name__)


def read_trajectories(path: Path) -> list[Trajectory]:
    """Every complete line of ``path`` (none if it does not exist); a torn last line is skipped."""
    if not path.exists():
        return []
    out = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.endswith("\n"):
                log.warning("%s: ignoring a partial last line %d (an interrupted write)", path, lineno)
                break
            if line.strip():
                out.append(Trajectory.from_json(line))
    return out


class TrajectoryWriter:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _cut_partial_line(path)
        self._fh = path.open("a", encoding="utf-8")

    def write(self, trajectory: Trajectory) -> None:
        self._fh.write(trajectory.to_json() + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut_partial_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as fh:
        data = fh.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            log.warning("%s: removing a partial last line (%d bytes) left by an interrupted run", path, len(data) - end)
            fh.truncate(end)
