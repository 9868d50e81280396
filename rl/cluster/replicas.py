"""Engine replicas as Ray actors, seen from the driver (``cluster=ray``).

:class:`RayFleet` reserves one placement group for the run's replicas, a bundle each (``cluster.engine``
resources, ``cluster.placement`` strategy: SPREAD puts them on different nodes where it can), and
starts a :class:`~sao.rl.cluster.engine_host.EngineHost` actor in every bundle. Each :class:`RayEngine` is
what the rollout driver's :class:`~sao.rl.rollout.replica_health.Replica` needs:

- ``root``: the replica's current URL (node IP + port). It changes when the replica comes back on
  another node: the driver's client and control follow it (:mod:`sao.rl.rollout.following`).
- ``alive()``: the actor's liveness as a background pinger last saw it (every ``cluster.ping_s``): an
  actor that died, or whose node died, or whose server exited, is False at once, without a request.
- ``restart()``: the old actor is stopped (or killed) and a new one started in the same bundle. When a node dies,
  Ray's control store moves the placement group's bundles that lived there to nodes that have the
  resources; the new actor starts there (it waits up to ``cluster.placement_timeout_s`` for one).
  The driver then syncs it to the newest version (``ReplicaRestarted``), as for a local replica.
- ``localize(folder)``: a weight version made readable on the replica's node (shipped through the
  object store by :class:`~sao.rl.weights.staging.ObjectStoreStager`, or as is with ``shared_dir``).
- ``row()``: its line of ``RUN_DIR/engines.json``, node included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from pathlib import Path
from typing import Any

from sao.agents import EngineStartError
from sao.rl.cluster.engine_host import EngineHost, HostAddress, Launch
from sao.rl.config import ClusterConfig, ConfigError
from sao.rl.weights import ObjectStoreStager

log = logging.getLogger(__name__)

_ACTOR_THREADS = 4  # start, ping and receive may run at once in one actor


class RayEngine:
    """One replica: its actor in bundle ``index`` of the fleet's placement group (module doc)."""

    def __init__(self, index: int, fleet: RayFleet):
        self.index, self.fleet = index, fleet
        self.address: HostAddress | None = None
        self.restarts = 0
        self._actor: Any = None
        self._life = 0  # bumped at each (re)start: a ping answered by a past actor is ignored
        self._alive = False
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- what the driver reads

    @property
    def root(self) -> str:
        return self.address.url if self.address else ""

    def url(self) -> str | None:
        """The current URL; None while the replica is down or starting."""
        return self.address.url if self.address and self._alive else None

    def alive(self) -> bool:
        return self._alive

    def row(self) -> dict[str, Any]:
        a = self.address
        return {"url": self.root, "managed": True, "cluster": "ray", "node_id": a.node_id if a else None,
                "node_ip": a.node_ip if a else None, "pid": a.pid if a else None, "log": a.log if a else None,
                "actor_pid": a.actor_pid if a else None, "restarts": self.restarts}

    # ---------------------------------------------------------------- life cycle

    def begin(self) -> Any:
        """Create the actor and ask it to start its server; returns the start's object reference."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        fleet = self.fleet
        r = fleet.cluster.engine
        actor = ray.remote(EngineHost).options(
            num_cpus=r.num_cpus, num_gpus=r.num_gpus, resources=dict(r.resources), max_restarts=0,
            max_concurrency=_ACTOR_THREADS,
            scheduling_strategy=PlacementGroupSchedulingStrategy(fleet.group, placement_group_bundle_index=self.index,
                                                                 placement_group_capture_child_tasks=False),
        ).remote(self.index, fleet.run_id, fleet.cluster.node_dir)
        with self._lock:
            self._actor, self._alive, self.address = actor, False, None
            self._life += 1
        return actor.start.remote(fleet.launch, fleet.model_source())

    def finish(self, started: Any, timeout_s: float) -> None:
        """Wait for :meth:`begin`'s start; the replica serves from then on."""
        import ray

        try:
            address = ray.get(started, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            self._kill()
            raise EngineStartError(f"replica {self.index} did not start within {timeout_s:.0f} s (no node with "
                                   f"{self.fleet.cluster.engine} free, or a slow engine start)") from exc
        except Exception as exc:
            self._kill()
            raise EngineStartError(f"replica {self.index} failed to start: {exc}") from exc
        with self._lock:
            self.address, self._alive = address, True
        log.info("replica %d serves at %s on node %s (%s)", self.index, address.url, address.node_ip,
                 address.node_id[:12])

    def restart(self) -> None:
        """A new actor for this replica (module doc); blocks until it serves. Run off the event loop.

        The old actor is asked to stop its server first (its whole process group), then killed: a kill
        alone could leave vLLM's engine core running when the actor still lived (a failed weight load)."""
        self.stop(timeout_s=20)
        self.restarts += 1
        self.finish(self.begin(), self.fleet.start_timeout_s)

    def stop(self, timeout_s: float = 60) -> None:
        """Stop the server (its whole process tree) and the actor; a dead or silent actor is killed."""
        import ray

        actor = self._actor
        if actor is None:
            return
        with contextlib.suppress(Exception):
            ray.get(actor.stop.remote(), timeout=timeout_s)
        self._kill()

    def _kill(self) -> None:
        import ray

        with self._lock:
            actor, self._actor, self._alive = self._actor, None, False
            self._life += 1
        if actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)

    def ping(self, timeout_s: float) -> None:
        """Update :meth:`alive` from the actor (the pinger thread calls it)."""
        import ray

        with self._lock:
            actor, life, serving = self._actor, self._life, self.address is not None
        if actor is None or not serving:
            return
        try:
            running = bool(ray.get(actor.ping.remote(), timeout=timeout_s))
        except ray.exceptions.GetTimeoutError:
            return  # busy or slow: /health decides about a hung replica
        except Exception as exc:  # noqa: BLE001 - the actor or its node is gone
            log.warning("replica %d: its actor is gone (%s)", self.index, type(exc).__name__)
            running = False
        with self._lock:
            if life == self._life and not running:
                self._alive = False

    # ---------------------------------------------------------------- weights

    async def localize(self, folder: Path) -> str:
        """Where this replica's node reads the weight version ``folder`` (module doc)."""
        if self.fleet.stager is None:  # shared_dir: every node reads the same path
            return str(folder)
        actor = self._actor
        if actor is None:
            raise EngineStartError(f"replica {self.index} is down")
        ref = await asyncio.to_thread(self.fleet.stager.ref, folder)
        return str(await actor.receive.remote(ref, self.fleet.keep_versions))


class RayFleet:
    """The run's engine replicas on the cluster (module doc); a context manager.

    ``launch``: how each actor starts its server (:class:`~sao.rl.cluster.engine_host.VLLMLaunch`);
    ``model_dir``: the folder the servers start from (``RUN_DIR/engine_model``), shipped to every
    replica's node unless ``cluster.weights=shared_dir``; ``start_timeout_s``: one start's bound
    (placement included).
    """

    def __init__(self, cluster: ClusterConfig, n: int, launch: Launch, model_dir: Path, *, run_id: str | None = None,
                 start_timeout_s: float = 600.0, keep_versions: int = 2):
        self.cluster, self.n, self.launch, self.model_dir = cluster, n, launch, Path(model_dir)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.start_timeout_s = start_timeout_s + cluster.placement_timeout_s
        self.keep_versions = keep_versions
        self.stager = ObjectStoreStager(keep=keep_versions) if cluster.weights == "object_store" else None
        self.group: Any = None
        self.engines = [RayEngine(i, self) for i in range(n)]
        self._stop = threading.Event()
        self._pinger: threading.Thread | None = None

    def model_source(self) -> Any:
        """The starting model as the actor takes it: the object reference of its files, or its path."""
        if self.stager is None:
            return str(self.model_dir.resolve())
        return self.stager.ref(self.model_dir, pin=True)

    def __enter__(self) -> RayFleet:
        import ray
        from ray.util.placement_group import placement_group

        bundle = self.cluster.engine.bundle() or {"CPU": 0.01}
        self.group = placement_group([dict(bundle) for _ in range(self.n)], strategy=self.cluster.placement,
                                     name=f"sao-engines-{self.run_id}")
        try:
            ray.get(self.group.ready(), timeout=self.cluster.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._remove_group()
            raise ConfigError(
                f"the Ray cluster cannot hold {self.n} engine replica(s) of {bundle} with placement "
                f"{self.cluster.placement} (waited {self.cluster.placement_timeout_s:.0f} s; cluster resources "
                f"{ray.cluster_resources()}): lower rollout.replicas or cluster.engine, or add nodes") from None
        try:
            started = [e.begin() for e in self.engines]  # every replica starts at once
            for engine, ref in zip(self.engines, started):
                engine.finish(ref, self.start_timeout_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self._pinger = threading.Thread(target=self._ping_all, name="sao-ray-pinger", daemon=True)
        self._pinger.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._pinger is not None:
            self._pinger.join(timeout=10)
        for engine in self.engines:
            engine.stop()
        self._remove_group()
        if self.stager is not None:
            self.stager.clear()

    def _remove_group(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if self.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.group = None

    def _ping_all(self) -> None:
        while not self._stop.wait(self.cluster.ping_s):
            for engine in self.engines:
                if self._stop.is_set():
                    return
                engine.ping(timeout_s=max(5.0, 2 * self.cluster.ping_s))
