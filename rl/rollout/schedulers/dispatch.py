"""The one place a scheduler's event is told apart by kind: :func:`dispatch` calls the handler's method for it.

Every mode handles the same five events (:data:`~sao.rl.rollout.schedulers.core.Event`); a mode is an
:class:`EventHandler` and its ``on_event`` is ``dispatch(event, self, now)`` plus what it does after
any event (train what is ready, admit new work). An event of an unknown kind is a ``TypeError``.
"""

from __future__ import annotations

from typing import Protocol

from sao.rl.rollout.schedulers.core import (
    Action,
    Event,
    ReplicaDied,
    ReplicaRestarted,
    SyncDone,
    TrainStepDone,
    TrajectoryFinished,
)


class EventHandler(Protocol):
    """What a mode does with each kind of event; each returns the actions it implies."""

    name: str

    def on_finished(self, event: TrajectoryFinished, now: float) -> list[Action]: ...

    def on_step_done(self, event: TrainStepDone, now: float) -> list[Action]: ...

    def on_sync_done(self, event: SyncDone) -> list[Action]: ...

    def on_replica_died(self, event: ReplicaDied) -> list[Action]: ...

    def on_replica_restarted(self, event: ReplicaRestarted) -> list[Action]: ...


def dispatch(event: Event, handler: EventHandler, now: float) -> list[Action]:
    """``handler``'s answer to ``event`` at driver time ``now``."""
    if isinstance(event, TrajectoryFinished):
        return handler.on_finished(event, now)
    if isinstance(event, TrainStepDone):
        return handler.on_step_done(event, now)
    if isinstance(event, SyncDone):
        return handler.on_sync_done(event)
    if isinstance(event, ReplicaDied):
        return handler.on_replica_died(event)
    if isinstance(event, ReplicaRestarted):
        return handler.on_replica_restarted(event)
    raise TypeError(f"{handler.name}: unknown event {event!r}")
