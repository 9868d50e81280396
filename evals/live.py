"""What each running episode is doing, for ``sao-eval``'s live status lines: one :class:`Worker` per
episode in flight (instance, sample, the environment steps so far, where it is now, since when),
kept on a :class:`Board` that the console reads while the episodes run.

The episode's environment is wrapped by :class:`CountedSteps`, which counts its ``step`` calls and
says whether the environment (a command in a container, the grading) or the model has the turn;
nothing in the agent loops knows about it, so every player (the model, a scripted agent, a graded
prediction) shows up the same way. Steps run in threads (``asyncio.to_thread``), so the board is
locked and readers get copies.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
from rich.progress import Progress
from rich.text import Text

RESETTING, MODEL, ENV = "starting", "model", "env"  # where an episode is: its reset, the model's turn, a step


@dataclass(frozen=True)
class Worker:
    """One episode in flight, as a status line shows it."""

    task_id: str
    sample: int
    started: float  # the board's clock when the episode started
    steps: int = 0  # environment steps taken so far
    phase: str = RESETTING  # RESETTING | MODEL | ENV


class Board:
    """The episodes in flight, keyed by (task id, sample); ``clock`` is ``time.monotonic`` unless a test
    gives its own."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._workers: dict[tuple[str, int], Worker] = {}

    @contextlib.contextmanager
    def tracking(self, task_id: str, sample: int) -> Iterator[tuple[str, int]]:
        """The episode is on the board for the block, and off it afterwards whatever happened."""
        key = (task_id, sample)
        with self._lock:
            self._workers[key] = Worker(task_id, sample, started=self.clock())
        try:
            yield key
        finally:
            with self._lock:
                self._workers.pop(key, None)

    def update(self, key: tuple[str, int], **changes: Any) -> None:
        with self._lock:
            if key in self._workers:
                self._workers[key] = replace(self._workers[key], **changes)

    def workers(self) -> list[Worker]:
        """The episodes in flight, the longest-running first."""
        with self._lock:
            return sorted(self._workers.values(), key=lambda w: (w.started, w.task_id, w.sample))

    def lines(self, *, most: int = 8, samples: bool = False) -> list[str]:
        """One line per episode in flight (``most`` of them, the longest-running; then how many more):
        ``instance[#sample]  step N  elapsed  (phase)``."""
        now, workers = self.clock(), self.workers()
        shown = [f"{w.task_id}{f'#{w.sample}' if samples else ''}  step {w.steps}  {elapsed(now - w.started)}  "
                 f"({w.phase})" for w in workers[:most]]
        if len(workers) > most:
            shown.append(f"... and {len(workers) - most} more")
        return shown


def elapsed(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class CountedSteps(gym.Wrapper):
    """``env`` with its steps counted on ``board`` under ``key`` (reset: :data:`RESETTING`, a step in
    progress: :data:`ENV`, otherwise :data:`MODEL`)."""

    def __init__(self, env: gym.Env, board: Board, key: tuple[str, int]):
        super().__init__(env)
        self.board, self.key, self.steps = board, key, 0

    def reset(self, **kwargs: Any) -> Any:
        self.board.update(self.key, phase=RESETTING)
        out = self.env.reset(**kwargs)
        self.board.update(self.key, phase=MODEL)
        return out

    def step(self, action: Any) -> Any:
        self.board.update(self.key, phase=ENV)
        try:
            return self.env.step(action)
        finally:
            self.steps += 1
            self.board.update(self.key, steps=self.steps, phase=MODEL)


@contextlib.contextmanager
def watched(board: Board | None, task_id: str, sample: int) -> Iterator[Callable[[gym.Env], gym.Env]]:
    """For the block, the episode is on ``board``, and the function given wraps its environment in
    :class:`CountedSteps`; without a board, nothing is tracked and the environment is left as it is."""
    if board is None:
        yield lambda env: env
        return
    with board.tracking(task_id, sample) as key:
        yield lambda env: CountedSteps(env, board, key)


class BoardProgress(Progress):
    """A rich progress bar with the board's status lines under it (one per episode in flight)."""

    def __init__(self, *columns: Any, board: Board, samples: bool = False, most: int = 8, **kwargs: Any):
        self.board, self.samples, self.most = board, samples, most  # first: rich draws while it is made
        super().__init__(*columns, **kwargs)

    def get_renderables(self) -> Iterator[Any]:
        yield self.make_tasks_table(self.tasks)
        if lines := self.board.lines(most=self.most, samples=self.samples):
            yield Text("\n".join(f"  {line}" for line in lines), style="dim")
