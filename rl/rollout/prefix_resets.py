"""A weight load whose prefix-cache reset the engine refused: recorded, warned about, retried.

vLLM refuses to reset its prefix cache while blocks are in use, which is always the case under
``rollout.keep_kv`` with requests in flight. Until a retry succeeds, the replica's KV cache may hold
blocks computed with the old weights, and the turns sampled then are flagged ``old_kv``
(:mod:`sao.rl.rollout.served` holds the rule and the state; :mod:`sao.rl.rollout.versioned_client`
stamps the turns). Nothing waits for the reset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sao.rl.rollout.replica_health import Replica, ReplicaHealth
from sao.rl.rollout.served import ServedVersions
from sao.rl.weights import Served

log = logging.getLogger(__name__)


class PrefixResets:
    """What the driver does as a replica resumes on new weights (module doc): records the version and
    the state of its KV cache, warns at a replica's first refused reset (later ones are logged at info),
    and retries the reset in the background, backing off."""

    def __init__(self, replicas: Sequence[Replica], versions: ServedVersions, health: ReplicaHealth,
                 spawn: Callable[[Awaitable[Any]], Any], *, keep_kv: bool,
                 first_delay_s: float = 0.05, max_delay_s: float = 1.0):
        self.replicas, self.versions, self.health, self.spawn = replicas, versions, health, spawn
        self.keep_kv, self.first_delay_s, self.max_delay_s = keep_kv, first_delay_s, max_delay_s
        self._warned: set[int] = set()  # replicas whose refused reset was warned about
        self._retrying: set[int] = set()  # replicas whose reset is being retried

    def resumed(self, rid: int, version: int, reset: bool) -> None:
        """Replica ``rid`` resumes on ``version``, its prefix cache ``reset`` or not."""
        self.versions.apply(Served(rid, version))
        if reset:
            self.versions.kv_reset(rid)
            return
        self.versions.old_kv(rid)
        why = "rollout.keep_kv kept the in-flight requests' blocks" if self.keep_kv else "blocks were in use"
        first = rid not in self._warned
        self._warned.add(rid)
        log.log(logging.WARNING if first else logging.INFO,
                "replica %d resumed on version %d with its prefix cache not reset (the engine refused: %s); "
                "turns sampled until a retry of the reset succeeds are flagged old_kv: their tokens may have been "
                "computed over a prefix of the old weights (%d refused so far: rollout/prefix_reset_refused)",
                rid, version, why, self.versions.refused_resets)
        if rid not in self._retrying:
            self._retrying.add(rid)
            self.spawn(self._retry(rid))

    async def _retry(self, rid: int) -> None:
        """Retry replica ``rid``'s reset until it succeeds (its KV cache is then clean), the replica dies (a
        restart starts clean) or a later load reset it."""
        delay, generation = self.first_delay_s, self.health.generation(rid)
        try:
            while self.versions.kv(rid).old and self.health.current(rid, generation):
                await asyncio.sleep(delay)
                delay = min(2 * delay, self.max_delay_s)
                try:
                    if await self.replicas[rid].control.reset_prefix_cache():
                        self.versions.kv_reset(rid)
                        log.info("replica %d: prefix cache reset; its turns are no longer flagged old_kv", rid)
                except Exception as exc:  # noqa: BLE001 - the replica's watch decides whether it died
                    log.debug("replica %d: prefix-cache reset failed: %r", rid, exc)
        finally:
            self._retrying.discard(rid)
