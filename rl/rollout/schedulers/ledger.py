"""Accounting shared by every rollout mode: nothing admitted is ever lost or counted twice.

Two levels are kept:

* attempts (one per :class:`~sao.rl.rollout.schedulers.core.StartTrajectory`, keyed by ``traj_id``): each is
  in flight, then waiting for the trainer, then ends in exactly one of *trained*, *requeued* (its
  request will be admitted again as a new attempt) or *failed*. Invariant:
  ``admitted == trained + requeued + failed + in_flight + waiting``.
* requests (a prompt sample, keyed by ``Prompt.key``, across attempts): opened at the first
  attempt, closed when one attempt is trained or the request fails for good. An open request is in
  flight, waiting, or in the scheduler's retry queue; :meth:`Ledger.check` takes the queued keys.

Staleness of a trained attempt = learner version at train time (``TrainOn.step``) minus the oldest
policy version among its tokens; the ledger keeps its histogram.

Its counts leave it as typed records, read by attribute: :class:`LedgerCounts` (this ledger now,
also parsed back strictly from a scheduler's ``ledger/`` metrics) and :class:`ClosedCounts` (a run's
attempts that ended for good, in every process so far: what a checkpoint keeps).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

from sao.rl.errors import CheckpointError
from sao.rl.rollout.schedulers.core import LedgerError, Prompt

log = logging.getLogger(__name__)


class State(str, Enum):
    IN_FLIGHT = "in_flight"
    WAITING = "waiting"  # finished, not yet given to the trainer
    TRAINED = "trained"
    REQUEUED = "requeued"
    FAILED = "failed"


_TERMINAL = (State.TRAINED, State.REQUEUED, State.FAILED)


@dataclass
class Attempt:
    """One attempt's bookkeeping. ``version``: the replica's version when it started;
    ``versions``: what the driver reported per turn/token at the end."""

    traj_id: int
    prompt: Prompt
    replica: int
    version: int
    admitted_at: float
    state: State = State.IN_FLIGHT
    versions: tuple[int, ...] = ()
    n_tokens: int = 0
    finished_at: float | None = None

    @property
    def oldest_version(self) -> int:
        return min(self.versions) if self.versions else self.version


@dataclass(frozen=True)
class LedgerCounts:
    """A ledger's counts at one moment (module doc): attempts ``admitted`` = ``in_flight`` + ``waiting``
    + ``trained`` + ``requeued`` + ``failed``; requests opened (``requests``) and closed as failed
    (``requests_failed``)."""

    admitted: int = 0
    in_flight: int = 0
    waiting: int = 0
    trained: int = 0
    requeued: int = 0
    failed: int = 0
    requests: int = 0
    requests_failed: int = 0

    @classmethod
    def from_stats(cls, stats: Mapping[str, float]) -> LedgerCounts:
        """The counts in a scheduler's ``stats()`` (its ``ledger/<name>`` keys, :meth:`Ledger.summary`).
        A count the ledger never moved has no key and is 0; a ``ledger/`` key that names no count is a
        :class:`LedgerError`."""
        names = {f.name for f in fields(cls)}
        counts = {k.removeprefix("ledger/"): v for k, v in stats.items() if k.startswith("ledger/")}
        if unknown := sorted(set(counts) - names):
            raise LedgerError(f"unknown ledger count(s) {unknown} (known: {', '.join(sorted(names))})")
        return cls(**{k: int(v) for k, v in counts.items()})

    @property
    def open(self) -> int:
        """Attempts not ended: in flight or waiting for the trainer."""
        return self.in_flight + self.waiting


@dataclass(frozen=True)
class ClosedCounts:
    """A run's attempts that ended for good, earlier processes' included: ``admitted`` (less those in
    flight or waiting, which a resumed run admits again), ``trained``, ``requeued``, ``failed``. Floats,
    as a checkpoint's ``source.counts`` holds them (:meth:`to_json`)."""

    admitted: float = 0.0
    trained: float = 0.0
    requeued: float = 0.0
    failed: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClosedCounts:
        """The counts a checkpoint wrote (:meth:`to_json`). A key an older checkpoint lacks counts 0;
        a key that names no count is a :class:`~sao.rl.errors.CheckpointError`."""
        names = [f.name for f in fields(cls)]
        if unknown := sorted(set(data) - set(names)):
            raise CheckpointError(f"the checkpoint's rollout counts hold unknown key(s) {unknown} "
                                  f"(known: {', '.join(names)})")
        return cls(**{k: float(v) for k, v in data.items()})


class Ledger:
    """The attempt and request ledger of one scheduler (see the module docstring)."""

    def __init__(self) -> None:
        self._live: dict[int, Attempt] = {}
        self._ended: dict[int, State] = {}
        self.counts: Counter[str] = Counter()
        self.causes: Counter[str] = Counter()
        self.staleness: Counter[int] = Counter()
        self._open: set[tuple[int, int]] = set()

    # ------------------------------------------------------------ transitions

    def admit(self, traj_id: int, prompt: Prompt, replica: int, version: int, now: float) -> Attempt:
        if traj_id in self._live or traj_id in self._ended:
            raise LedgerError(f"trajectory {traj_id} admitted twice")
        attempt = Attempt(traj_id, prompt, replica, version, now)
        self._live[traj_id] = attempt
        self.counts["admitted"] += 1
        self.counts["in_flight"] += 1
        if prompt.key not in self._open:
            self._open.add(prompt.key)
            self.counts["requests"] += 1
        return attempt

    def finish(self, traj_id: int, versions: tuple[int, ...], n_tokens: int, now: float) -> Attempt:
        a = self._get(traj_id, State.IN_FLIGHT, "finish")
        a.state, a.versions, a.n_tokens, a.finished_at = State.WAITING, tuple(versions), n_tokens, now
        self.counts["in_flight"] -= 1
        self.counts["waiting"] += 1
        return a

    def move(self, traj_id: int, replica: int) -> Attempt:
        """The running attempt continues on ``replica`` (same version; the scheduler checks that)."""
        a = self._get(traj_id, State.IN_FLIGHT, "move")
        a.replica = replica
        return a

    def train(self, traj_ids: Iterable[int], step: int) -> list[int]:
        """Mark waiting attempts trained at learner version ``step``; returns their staleness."""
        out = []
        for tid in traj_ids:
            a = self._end(tid, State.TRAINED, (State.WAITING,))
            s = step - a.oldest_version
            if s < 0:
                raise LedgerError(f"trajectory {tid} has version {a.oldest_version} newer than the learner's {step}")
            self.staleness[s] += 1
            self._open.discard(a.prompt.key)
            out.append(s)
        return out

    def requeue(self, traj_id: int, cause: str) -> Attempt:
        """The attempt ends untrained; its request stays open (the caller queues ``prompt.retry()``)."""
        a = self._end(traj_id, State.REQUEUED, (State.IN_FLIGHT, State.WAITING))
        self.causes[f"requeued/{cause}"] += 1
        return a

    def fail(self, traj_id: int, cause: str) -> Attempt:
        """The attempt ends untrained and its request is closed as failed."""
        a = self._end(traj_id, State.FAILED, (State.IN_FLIGHT, State.WAITING))
        self.causes[f"failed/{cause}"] += 1
        self.close_failed(a.prompt, cause, count=False)
        return a

    def close_failed(self, prompt: Prompt, cause: str, count: bool = True) -> None:
        """Close an open request that has no live attempt (e.g. a queued retry of a failed group)."""
        if prompt.key not in self._open:
            raise LedgerError(f"request {prompt.key} is not open")
        self._open.discard(prompt.key)
        self.counts["requests_failed"] += 1
        if count:
            self.causes[f"failed/{cause}"] += 1

    # ------------------------------------------------------------ queries

    def get(self, traj_id: int) -> Attempt | None:
        """The live (in flight or waiting) attempt, or None when it ended or is unknown."""
        return self._live.get(traj_id)

    def live(self) -> list[Attempt]:
        return list(self._live.values())

    @property
    def open_requests(self) -> set[tuple[int, int]]:
        return set(self._open)

    def check(self, queued: Iterable[tuple[int, int]] = ()) -> None:
        """Raise :class:`LedgerError` unless both levels balance. ``queued``: the keys of requests
        waiting in the scheduler's retry queue."""
        c = self.counts
        total = c["trained"] + c["requeued"] + c["failed"] + c["in_flight"] + c["waiting"]
        if c["admitted"] != total:
            raise LedgerError(f"admitted {c['admitted']} != trained + requeued + failed + in_flight + waiting = {total} "
                              f"({dict(c)})")
        states = Counter(a.state.value for a in self._live.values())
        if states["in_flight"] != c["in_flight"] or states["waiting"] != c["waiting"]:
            raise LedgerError(f"live attempts {dict(states)} disagree with counts {dict(c)}")
        if sum(self.staleness.values()) != c["trained"]:
            raise LedgerError("staleness histogram does not cover every trained attempt")
        live_keys = {a.prompt.key for a in self._live.values()}
        accounted = live_keys | set(queued)
        if accounted != self._open:
            missing, extra = sorted(self._open - accounted)[:5], sorted(accounted - self._open)[:5]
            raise LedgerError(f"open requests not accounted for: missing {missing}, unexpected {extra}")
        if c["requests"] != c["trained"] + c["requests_failed"] + len(self._open):
            raise LedgerError(f"requests {c['requests']} != trained {c['trained']} + failed "
                              f"{c['requests_failed']} + open {len(self._open)}")

    def tally(self) -> LedgerCounts:
        """The counts now, as a record."""
        return LedgerCounts(**self.counts)

    def summary(self) -> dict[str, float]:
        """Counts plus staleness statistics, with ``ledger/`` and ``staleness/`` keys."""
        out: dict[str, float] = {f"ledger/{k}": float(v) for k, v in sorted(self.counts.items())}
        n = sum(self.staleness.values())
        out["staleness/max"] = float(max(self.staleness, default=0))
        out["staleness/mean"] = sum(s * k for s, k in self.staleness.items()) / n if n else 0.0
        return out

    # ------------------------------------------------------------ internals

    def _get(self, traj_id: int, state: State, what: str) -> Attempt:
        a = self._live.get(traj_id)
        if a is None or a.state is not state:
            now = a.state.value if a else self._ended.get(traj_id, "unknown")
            raise LedgerError(f"cannot {what} trajectory {traj_id}: it is {getattr(now, 'value', now)}")
        return a

    def _end(self, traj_id: int, to: State, allowed: tuple[State, ...]) -> Attempt:
        a = self._live.get(traj_id)
        if a is None or a.state not in allowed:
            now = a.state.value if a else getattr(self._ended.get(traj_id), "value", "unknown")
            raise LedgerError(f"cannot mark trajectory {traj_id} {to.value}: it is {now}")
        del self._live[traj_id]
        self.counts[a.state.value] -= 1
        a.state = to
        self._ended[traj_id] = to
        self.counts[to.value] += 1
        return a
