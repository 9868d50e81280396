"""``cluster=ray``: the connection to a Ray cluster (:mod:`.connection`), engine replicas as Ray actors
seen from the driver (:mod:`.replicas`) and on their node (:mod:`.engine_host`), and learner ranks as
actors (:mod:`.learner_ranks`). Ray is imported on use only."""
