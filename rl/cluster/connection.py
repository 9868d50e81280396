"""``cluster=ray``: the connection to an existing Ray cluster, for the run's lifetime.

Only this module, :mod:`sao.rl.cluster.replicas` and :mod:`sao.rl.cluster.learner_ranks` import ``ray``, and only
when a run asks for ``cluster=ray`` (``cluster=local`` never imports it). The driver (``sao-train``)
connects to the cluster at ``cluster.address`` and is rank 0 of the learner; the engine replicas
(:mod:`sao.rl.cluster.replicas`) and learner ranks 1..N-1 (:mod:`sao.rl.cluster.learner_ranks`) are Ray actors
that the driver owns, so Ray ends them if the driver dies.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from sao.rl.config import ClusterConfig, ConfigError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def connect(cfg: ClusterConfig) -> Iterator[str]:
    """Connect to the cluster (``ray.init(address=cfg.address)``); yields this node's IP, which
    the learner's other ranks reach rank 0 at. Disconnects at the end (the cluster stays up)."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("cluster=ray needs the `ray` package (pip install ray)") from exc

    try:
        ray.init(address=cfg.address, namespace=cfg.namespace, logging_level=logging.WARNING,
                 log_to_driver=False)
    except ConnectionError as exc:
        raise ConfigError(f"cluster=ray could not connect to a Ray cluster at cluster.address={cfg.address} ({exc}); "
                          "start one with `ray start --head` (docs/guides/scale-out.md)") from exc
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        log.info("connected to the Ray cluster at %s: %d node(s), resources %s", cfg.address, len(nodes),
                 ray.cluster_resources())
        yield ray.util.get_node_ip_address()
    finally:
        ray.shutdown()
