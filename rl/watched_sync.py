"""``rollout=sync`` on a managed engine that may die: the weight sync survives the engine's restart.

The run's :class:`~sao.agents.engine_watch.EngineWatch` notices the engine's death (its process
exited) and starts it again on its port. A restarted vLLM serves the weights it was launched with
(``RUN_DIR/engine_model/``, the initial policy), so before any episode runs on it,
:meth:`WatchedWeightSync.restore` (the watch's ``on_restart``) loads the version it served last
(``weights/v{k}``, labelled ``k``): the batch being sampled continues on the same policy, and
:class:`~sao.rl.sources.SyncRollout` re-runs the episodes the death cut. A sync that the death cut
is made again once the engine is back. The scheduled modes restart their replicas in
:mod:`sao.rl.replica_health` instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from torch import nn

from sao.agents.engine_watch import EngineWatch, retry_on_death
from sao.rl.sync import WeightSync, list_versions, version_dir
from sao.rl.weight_load import load_weights

log = logging.getLogger(__name__)


class WatchedWeightSync:
    """A :class:`~sao.rl.sync.WeightSync` whose engine an :class:`EngineWatch` may restart (module doc).
    Set ``watch`` once the watch exists (it takes :meth:`restore` as its ``on_restart``)."""

    def __init__(self, inner: WeightSync, watch: EngineWatch | None = None):
        self.inner, self.watch = inner, watch
        self.served: int | None = None  # the version the engine served last; None before the first sync

    async def sync(self, model: nn.Module, version: int, *, probe: bool = True,
                   recent: Sequence[Any] = ()) -> dict[str, float]:
        async def once() -> dict[str, float]:
            return await self.inner.sync(model, version, probe=probe, recent=recent)

        metrics = await retry_on_death(self.watch, once)
        self.served = version
        return metrics

    async def restore(self) -> None:
        """Load the version the engine served before it died into the restarted engine."""
        if self.served is None:  # it died before the first sync, which is made again
            return
        version, folder = self.served, version_dir(self.inner.root, self.served)
        if not folder.is_dir():  # pruned by the sync the death cut (keep_weight_versions=1), which is made again
            version, folder = list_versions(self.inner.root)[-1]
        log.warning("the restarted engine loads version %d (%s) before it serves again", version, folder)
        await load_weights(self.inner.engine, folder, version, mode="keep", timeout_s=self.inner.reload_timeout_s)
