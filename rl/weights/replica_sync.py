"""``rollout=sync``'s weight sync: the learner pushes each version into the run's one engine, a replica
of the rollout driver like any other (:class:`~sao.rl.rollout.orchestrated.OrchestratedRollout` with the
``sync`` scheduler), which watches it and restarts it when it dies.

:class:`ReplicaWeightSync` runs a :class:`~sao.rl.weights.sync.WeightSync` (save, load, label, probe) on
replica ``rid`` and reports :class:`~sao.rl.weights.load.Served` ``(rid, version, pushed=True)`` to the
driver, which applies it to its record of what each replica serves; all before the trainer tells the
driver of the version (``on_weights``): the driver's own load of that version then finds it served and
has nothing to do, and what runs before the driver hears of it (the step's forgetting probes) is
stamped with the version it runs on. A push that the engine's death cut is made again once the driver
has restarted the engine and given it the version the scheduler holds (``PushTarget.back_since``).

The driver is seen through :class:`PushTarget`, so this module imports nothing of :mod:`sao.rl.rollout`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from torch import nn

from sao.rl.weights.load import Served
from sao.rl.weights.sync import WeightSync

log = logging.getLogger(__name__)


class PushTarget(Protocol):
    """The rollout driver as a push sees it (``OrchestratedRollout``)."""

    def generation(self, rid: int) -> int:
        """Replica ``rid``'s life: bumped at each of its deaths."""
        ...

    async def back_since(self, rid: int, generation: int) -> bool:
        """Whether ``rid`` died after ``generation`` was read and is back now, serving the scheduler's
        version (False: it lives; a failed call was the caller's own)."""
        ...

    def apply(self, event: Served) -> None:
        """Record that a replica serves a version now."""
        ...


class ReplicaWeightSync:
    """A :class:`~sao.rl.weights.sync.WeightSync` into ``target``'s replica ``rid`` (module doc)."""

    def __init__(self, inner: WeightSync, target: PushTarget, rid: int = 0):
        self.inner, self.target, self.rid = inner, target, rid

    async def sync(self, model: nn.Module, version: int, *, probe: bool = True,
                   recent: Sequence[Any] = ()) -> dict[str, float]:
        while True:
            generation = self.target.generation(self.rid)
            try:
                metrics = await self.inner.sync(model, version, probe=probe, recent=recent)
            except Exception:
                if not await self.target.back_since(self.rid, generation):
                    raise  # the engine lives: the sync's own error
                log.warning("the weight sync to version %d was cut by the engine's death; it is made again", version)
                continue
            self.target.apply(Served(self.rid, version, pushed=True))
            return metrics
