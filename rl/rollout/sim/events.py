"""The simulator's own clock events: what it schedules on its heap, as typed records.

They are internal to :class:`~sao.rl.rollout.sim.simulator.Simulation` (the scheduler never sees them; it gets
:mod:`sao.rl.rollout.schedulers.core`'s events, which the simulator derives from these).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineDue:
    """Engine ``rid``'s next request completion is due; stale when the engine's ``epoch`` moved on
    (it restarted, or its batch changed and a newer completion time was pushed)."""

    rid: int
    epoch: int


@dataclass(frozen=True)
class EnvAnswered:
    """The environment answered trajectory ``tid``'s last turn: its next turn starts (ignored when the
    trajectory is gone, its engine having died)."""

    tid: int


@dataclass(frozen=True)
class SyncLanded:
    """Engine ``rid`` finished loading ``version``; stale unless ``token`` is still its latest sync."""

    rid: int
    version: int
    token: int


@dataclass(frozen=True)
class TrainStepEnds:
    """The trainer finished the job it was running."""


@dataclass(frozen=True)
class EngineDies:
    """Engine ``rid`` fails (its mean time between failures came up)."""

    rid: int


@dataclass(frozen=True)
class EngineBack:
    """Engine ``rid`` is back after its restart time."""

    rid: int


SimEvent = EngineDue | EnvAnswered | SyncLanded | TrainStepEnds | EngineDies | EngineBack
