"""Request routing across engine replicas: the routers (:mod:`.routers`; pure, no I/O), each
replica's load as a router reads it (:mod:`.replica_load`), and the completion client that places
every request with a router (:mod:`.client`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "client": ["RoutedReplica", "RoutingClient", "RoutingStats"],
        "replica_load": ["LoadBoard"],
        "routers": ["ROUTERS", "CacheAware", "Pinned", "ReplicaView", "RoundRobin", "RouteRequest", "Router",
                    "RouterConfigError", "make_router"],
    },
)
