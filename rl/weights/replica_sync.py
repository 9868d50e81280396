"""``rollout=sync``'s weight sync: the learner pushes each version into the run's one engine, a replica
of the rollout driver like any other (:class:`~sao.rl.rollout.orchestrated.OrchestratedRollout` with the
``sync`` scheduler), which watches it and restarts it when it dies.

:class:`ReplicaWeightSync` runs a :class:`~sao.rl.weights.sync.WeightSync` (save, load, label, probe) on
replica ``rid`` and records the version as the one the replica serves, all before the trainer tells
the driver (``on_weights``): the driver's own load of that version then finds the label and only
records it, and what runs before the driver hears of it (the step's forgetting probes) is stamped
with the version it runs on. A push that the engine's death cut is made again once the driver has
restarted the engine and given it the version the scheduler holds (``OrchestratedRollout.back_since``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from torch import nn

from sao.rl.rollout import OrchestratedRollout
from sao.rl.weights.sync import WeightSync

log = logging.getLogger(__name__)


class ReplicaWeightSync:
    """A :class:`~sao.rl.weights.sync.WeightSync` into ``source``'s replica ``rid`` (module doc)."""

    def __init__(self, inner: WeightSync, source: OrchestratedRollout, rid: int = 0):
        self.inner, self.source, self.rid = inner, source, rid

    async def sync(self, model: nn.Module, version: int, *, probe: bool = True,
                   recent: Sequence[Any] = ()) -> dict[str, float]:
        while True:
            generation = self.source.generation(self.rid)
            try:
                metrics = await self.inner.sync(model, version, probe=probe, recent=recent)
            except Exception:
                if not await self.source.back_since(self.rid, generation):
                    raise  # the engine lives: the sync's own error
                log.warning("the weight sync to version %d was cut by the engine's death; it is made again", version)
                continue
            self.source.replicas[self.rid].version = version
            return metrics
