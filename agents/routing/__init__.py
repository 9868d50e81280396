"""Request routing across engine replicas: the routers (:mod:`.routers`; pure, no I/O), each
replica's load as a router reads it (:mod:`.replica_load`), and the completion client that places
every request with a router (:mod:`.client`)."""
