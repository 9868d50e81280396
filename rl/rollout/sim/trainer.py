"""The simulator's learner, and its driver-side account of every attempt.

:class:`SimTrainer` runs ``TrainOn`` jobs in FIFO order: a job takes its trajectories' tokens /
``tokens_per_s`` seconds, and a final one adds the optimizer step's overhead. When a step ends its
trajectories count as trained, and the trainer records their staleness (learner version at train
time minus the oldest version among their tokens), lengths and the step's rollout-to-train-end time.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sao.rl.rollout.schedulers import LedgerError, LengthStats, TrainOn
from sao.rl.rollout.sim.config import TrainerConfig


@dataclass
class Finished:
    """What the trainer and the metrics need of a finished trajectory until it is trained or dropped."""

    versions: tuple[int, ...]
    total_tokens: int
    action_tokens: int
    key: tuple[int, int]


@dataclass
class Audit:
    """The driver-side account of every attempt (see ``lost`` in :mod:`metrics`)."""

    started: int = 0
    trained: set[int] = field(default_factory=set)
    requeued: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    dropped: int = 0
    killed: int = 0
    twice: int = 0

    def end(self, bucket: set[int], tid: int) -> None:
        if tid in self.trained or tid in self.requeued or tid in self.failed:
            self.twice += 1
        bucket.add(tid)


class SimTrainer:
    """The simulated learner (module docstring). ``k``: the staleness bound (trained beyond it: ``masked``)."""

    def __init__(self, config: TrainerConfig, k: int, audit: Audit, lengths: LengthStats, record: bool) -> None:
        self.config, self.k, self.audit, self.lengths, self.record = config, k, audit, lengths, record
        self.queue: deque[TrainOn] = deque()
        self.job: TrainOn | None = None
        self.items: dict[int, tuple[int, Finished]] = {}  # given to the trainer, step not done yet
        self.steps_done = 0
        self.staleness: Counter[int] = Counter()
        self.masked = self.mixed = 0
        self.trained_tokens = 0
        self.r2t: list[float] = []
        self.segments: list[tuple[float, float, int]] = []
        self._step_start: float | None = None

    def start_next(self, now: float, take: Callable[[int], Finished | None],
                   first_start: dict[tuple[int, int], float]) -> float:
        """Start the next queued job on the trajectories ``take`` hands over; returns when it ends."""
        job = self.queue.popleft()
        self.job = job
        tokens = 0
        for tid in job.traj_ids:
            f = take(tid)
            if f is None:
                raise LedgerError(f"TrainOn names trajectory {tid}, which is not finished and waiting")
            if tid in self.items:
                self.audit.twice += 1
            self.items[tid] = (job.step, f)
            tokens += f.total_tokens
            start = first_start.pop(f.key, now)
            self._step_start = start if self._step_start is None else min(self._step_start, start)
        duration = tokens / self.config.tokens_per_s
        if job.final:
            duration += self.config.step_overhead_s
        if self.record:
            self.segments.append((now, now + duration, job.step))
        return now + duration

    def finish(self, now: float) -> TrainOn:
        """The running job ended; a final one commits its optimizer step. Returns the job."""
        job, self.job = self.job, None
        assert job is not None
        if job.final:
            for tid, (step, f) in self.items.items():
                self.audit.end(self.audit.trained, tid)
                s = step - min(f.versions)
                self.staleness[s] += 1
                self.masked += s > self.k
                self.mixed += len(set(f.versions)) > 1
                self.trained_tokens += f.action_tokens
                self.lengths.on_trained(f.action_tokens)
            self.items.clear()
            self.steps_done += 1
            self.r2t.append(now - (self._step_start if self._step_start is not None else now))
            self._step_start = None
        return job
