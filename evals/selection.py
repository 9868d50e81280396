"""Which of a benchmark's tasks ``sao-eval`` runs: ``--instance-ids``, ``--filter``, ``--shuffle``,
``--slice`` and ``--limit``, applied in that order to the task ids in the benchmark's own order.

1. ``instance_ids``: only these (every one must be a task of the benchmark); they keep the
   benchmark's order, not the order given;
2. ``filter``: only the ids that the regular expression matches (``re.search``);
3. ``shuffle``: reorder by a hash of (``seed``, id), the same in every process, and an id's place
   relative to any other is the same whatever else was selected;
4. ``slice``: Python's ``ids[start:end]`` on the list so far (either side may be left out);
5. ``limit``: the first ``limit`` of what the slice left.

A step that leaves nothing is an :class:`~.errors.EvalError` that names it. Pure: no environment is
made here (the runner hands in the ids); the sampling seed of an episode does not depend on the
selection (:func:`sao.agents.loop.task_seed`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.hints import did_you_mean

from .errors import EvalError

Slice = tuple[int | None, int | None]  # START:END, either left out


@dataclass(frozen=True)
class Selection:
    """The selection flags of one run (see the module docstring for the order they apply in)."""

    instance_ids: tuple[str, ...] | None = None
    filter: str | None = None
    shuffle: bool = False
    seed: int = 0
    slice: Slice | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.instance_ids is not None and not self.instance_ids:
            raise EvalError("--instance-ids names no instance: give ids separated by commas, or a file with one a line")
        if self.filter is not None:
            compiled(self.filter)
        if self.limit is not None and self.limit < 1:
            raise EvalError(f"--limit must be >= 1, got {self.limit}")

    @property
    def narrowed(self) -> bool:
        """Whether any flag other than ``--limit`` is set (``--shuffle`` included)."""
        return self.instance_ids is not None or self.filter is not None or self.shuffle or self.slice is not None

    def stream_length(self, default: int) -> int:
        """How many tasks of an endless source (generated ids) to select from: ``limit`` or ``default``
        when nothing but ``--limit`` is set; otherwise the largest of ``default``, ``limit`` and the
        slice's end (a longer stream only adds ids after the same first ones)."""
        if not self.narrowed:
            return self.limit or default  # the stream's first ones: no more are made than are run
        end = self.slice[1] if self.slice is not None else None
        return max(default, self.limit or 0, end if end is not None and end > 0 else 0)

    def apply(self, ids: Sequence[str], *, source: str = "the benchmark") -> list[str]:
        """The selected ids of ``ids`` (all of the source's, in its order); ``source`` names them in errors."""
        chosen = list(dict.fromkeys(ids))
        if not chosen:
            return []  # the caller says that the benchmark has no tasks
        if self.instance_ids is not None:
            chosen = pick(chosen, self.instance_ids, source)
        if self.filter is not None:
            kept = [t for t in chosen if compiled(self.filter).search(t)]
            if not kept:
                raise EvalError(f"--filter {self.filter!r} matches none of the {len(chosen)} task id(s) of {source}"
                                f"{_narrowed_by(self.instance_ids is not None)} (e.g. {chosen[0]!r})")
            chosen = kept
        if self.shuffle:
            chosen = shuffled(chosen, self.seed)
        if self.slice is not None:
            start, end = self.slice
            if not chosen[start:end]:
                raise EvalError(f"--slice {format_slice(self.slice)} leaves none of the {len(chosen)} task id(s) of "
                                f"{source}{_narrowed_by(self.instance_ids is not None or self.filter is not None)}")
            chosen = chosen[start:end]
        return chosen if self.limit is None else chosen[:self.limit]

    def identity(self) -> dict[str, Any]:
        """What ``run.json`` records of the selection (``--resume`` must select the same): the ids
        sorted (their order does not matter), the slice as text; ``seed`` and ``limit`` are the run's own."""
        return {"instance_ids": None if self.instance_ids is None else sorted(set(self.instance_ids)),
                "filter": self.filter, "shuffle": self.shuffle,
                "slice": None if self.slice is None else format_slice(self.slice)}


def pick(ids: list[str], wanted: Sequence[str], source: str) -> list[str]:
    """The ``wanted`` ids, in the order of ``ids``; an id not in ``ids`` is an error that names it."""
    known = set(ids)
    unknown = [t for t in dict.fromkeys(wanted) if t not in known]
    if unknown:
        hint = did_you_mean(unknown[0], ids)
        shown = ", ".join(repr(t) for t in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise EvalError(f"--instance-ids: {len(unknown)} id(s) not in {source}: {shown}.{hint}")
    asked = set(wanted)
    return [t for t in ids if t in asked]


def compiled(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise EvalError(f"--filter {pattern!r} is not a regular expression: {exc} (Python's re syntax; "
                        "quote it in the shell)") from None


def shuffled(ids: Sequence[str], seed: int) -> list[str]:
    """``ids`` ordered by a BLAKE2b hash of (seed, id): deterministic across processes, and the
    relative order of two ids does not depend on which others are there."""
    return sorted(ids, key=lambda t: hashlib.blake2b(f"{seed}\x00{t}".encode(), digest_size=8).digest())


def parse_slice(text: str) -> Slice:
    """``START:END`` as Python slices read it (``10:20``, ``:50``, ``-10:``); a step is not taken."""
    parts = text.split(":")
    if len(parts) != 2:
        raise EvalError(f"--slice {text!r}: expected START:END (either may be left out, e.g. 10:20, :50, -10:)")
    try:
        start, end = (int(p) if p.strip() else None for p in parts)
    except ValueError:
        raise EvalError(f"--slice {text!r}: START and END must be integers (e.g. 10:20, :50, -10:)") from None
    return start, end


def format_slice(s: Slice) -> str:
    return ":".join("" if v is None else str(v) for v in s)


def parse_instance_ids(value: str) -> tuple[str, ...]:
    """``--instance-ids``: a file with one id a line (blank lines and ``#`` comments skipped) when
    ``value`` is an existing file, else ids separated by commas."""
    path = Path(value)
    if path.is_file():
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise EvalError(f"--instance-ids {value}: cannot be read ({exc})") from exc
        ids = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not ids:
            raise EvalError(f"--instance-ids {value}: the file names no instance (one id a line)")
    elif "/" in value or value.endswith(".txt"):
        raise EvalError(f"--instance-ids {value}: no such file (a file of ids, one a line, or ids separated by commas)")
    else:
        ids = [part.strip() for part in value.split(",") if part.strip()]
    return tuple(dict.fromkeys(ids))


def _narrowed_by(earlier: bool) -> str:
    return " left by the flags before it" if earlier else ""
