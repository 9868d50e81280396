"""Rollout on real engines: a scheduler of :mod:`.schedulers` driven by asyncio over engine replicas
(:mod:`.orchestrated`, its event loop :mod:`.driver_loop`), the seam between rollout and learner
(:mod:`.sources`), replica health and restarts (:mod:`.replica_health`), what each replica serves
(:mod:`.served`), the policy version of each turn
(:mod:`.versioned_client`), replicas that move (:mod:`.following`), episodes outside the schedule
(:mod:`.off_schedule`) and a rollout whose every attempt fails (:mod:`.failure_streak`).

The schedulers (:mod:`.schedulers`) and their simulator (:mod:`.sim`) are pure Python: no torch."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "following": ["FollowingClient", "FollowingControl"],
        "orchestrated": ["HealthConfig", "OrchestratedRollout", "Replica"],
        "sources": ["ProbingSource", "RolloutBatch", "RolloutSource", "ScheduledSource", "StreamingSource",
                    "rollout_meta"],
    },
)
