"""``cluster=ray``: the connection to a Ray cluster (:mod:`.connection`), engine replicas as Ray actors
seen from the driver (:mod:`.replicas`) and on their node (:mod:`.engine_host`), and learner ranks as
actors (:mod:`.learner_ranks`). Ray is imported on use only."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "connection": ["connect"],
        "engine_host": ["EngineHost", "FakeLaunch", "VLLMLaunch"],
        "learner_ranks": ["RayLearnerRanks"],
        "replicas": ["RayFleet"],
    },
)
