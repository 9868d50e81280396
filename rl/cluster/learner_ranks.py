"""The learner's ranks 1..N-1 as Ray actors (``cluster=ray``, ``learner.world_size > 1``).

Rank 0 is ``sao-train`` itself (the driver): it runs the trainer, the rollout and the checkpoints.
Each other rank is a :class:`RankHost` actor with ``cluster.learner`` resources, on whichever node
has them; it joins rank 0's ``torch.distributed`` group at ``tcp://<driver IP>:<port>`` (gloo on
CPUs, NCCL when the ranks have a GPU each) and runs :func:`sao.rl.learner.parallel.launch.serve_rank`, the same body
as a local follower process: :func:`sao.rl.learner.parallel.ranks.follow` mirrors rank 0's learner calls. The
learner's state is broadcast from rank 0, so a follower reads no run folder; it needs only the
model's architecture, from the same path if its node has it, else ``sao-model``'s copy of
``model.name`` on its node.

Why Ray actors and not Ray Train's ``TorchTrainer``: TorchTrainer runs one training function on
every worker, rank 0 included, inside Ray workers, and owns checkpointing, reporting and restarts.
Here rank 0 is the driver process, which also runs the asynchronous rollout, the weight sync and
sao's own checkpoints and exact resume; the other ranks only mirror its calls. Actors that join
rank 0's process group keep :func:`~sao.rl.learner.parallel.ranks.follow` and the local path
(:class:`sao.rl.learner.parallel.launch.LearnerRanks`) identical, and need only core ``ray`` (not ``ray[train]``).

A node failure under a follower is not survived: rank 0's next collective fails (or times out), the
run stops, and ``resume=true`` continues from the last checkpoint. Ray ends the actors when the
driver exits, since it owns them.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sao.rl.config import ConfigError, TrainConfig
from sao.rl.learner.parallel import Channel
from sao.rl.learner.parallel.launch import RankPlan, RankZero, _init, serve_rank

log = logging.getLogger(__name__)


class RankHost:
    """One follower rank's actor (module doc)."""

    def node(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def serve(self, rank: int, cfg: TrainConfig, model_path: str, plan: RankPlan) -> int:
        from sao.agents.models.prepare import ensure_model

        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank} %(name)s %(levelname)s %(message)s")
        path = model_path if Path(model_path).exists() else ensure_model(cfg.model.name)
        # Ray gives a GPU actor its own CUDA_VISIBLE_DEVICES: its GPU is cuda:0
        return serve_rank(rank, cfg, path, plan, device="cuda:0" if plan.backend == "nccl" else "cpu")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ray_plan(cfg: TrainConfig, host: str) -> RankPlan:
    """Ranks on the cluster: NCCL when each has a GPU (``cluster.learner.num_gpus`` >= 1 and rank 0
    has CUDA), gloo otherwise; threads: ``learner.threads``, else the rank's ``num_cpus``."""
    n, backend, r = cfg.learner.world_size, cfg.learner.backend, cfg.cluster.learner
    cuda = cfg.device in ("auto", "cuda") and torch.cuda.is_available() and r.num_gpus >= 1
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise ConfigError("learner.backend=nccl on cluster=ray needs cluster.learner.num_gpus >= 1 and a GPU on "
                          "rank 0 (the machine sao-train runs on)")
    threads = cfg.learner.threads or max(1, int(r.num_cpus))
    return RankPlan(n, backend, f"tcp://{host}:{_free_port(host)}", threads)


class RayLearnerRanks(RankZero):
    """Ranks 1..N-1 as Ray actors, started on enter and stopped on exit (module doc); rank 0's side is
    :class:`~sao.rl.learner.parallel.launch.RankZero`'s, as for :class:`~sao.rl.learner.parallel.launch.LearnerRanks`."""

    def __init__(self, cfg: TrainConfig, model_path: str, *, host: str | None = None) -> None:
        import ray

        self.cfg, self.model_path = cfg, model_path
        self.plan = ray_plan(cfg, host or ray.util.get_node_ip_address())
        self.actors: list[Any] = []
        self.runs: list[Any] = []
        self.nodes: list[tuple[str, str]] = []  # each follower's (node id, node IP)
        self.calls: list[int] = []  # each follower's learner calls, once stopped
        self.channel: Channel | None = None

    def __enter__(self) -> RayLearnerRanks:
        import ray

        p, r = self.plan, self.cfg.cluster.learner
        try:
            for _ in range(1, p.world_size):
                self.actors.append(ray.remote(RankHost).options(
                    num_cpus=r.num_cpus, num_gpus=r.num_gpus, resources=dict(r.resources), max_restarts=0).remote())
            try:
                self.nodes = ray.get([a.node.remote() for a in self.actors],
                                     timeout=self.cfg.cluster.placement_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise ConfigError(f"the Ray cluster has no room for {p.world_size - 1} learner rank(s) of {r} "
                                  f"(waited {self.cfg.cluster.placement_timeout_s:.0f} s; cluster resources "
                                  f"{ray.cluster_resources()})") from None
            self.runs = [a.serve.remote(rank, self.cfg, self.model_path, p)
                         for rank, a in enumerate(self.actors, start=1)]
            if p.backend == "nccl":
                torch.cuda.set_device(0)
            self.channel = self._join()
        except BaseException:
            self._kill()
            raise
        log.info("learner: %d data-parallel ranks (%s, %d threads each); ranks 1..%d on node(s) %s", p.world_size,
                 p.backend, p.threads, p.world_size - 1, ", ".join(ip for _, ip in self.nodes))
        return self

    def _join(self) -> Channel:
        """Rank 0 joins the group; a follower that fails before it joins fails this at once."""
        import ray

        box: dict[str, Any] = {}

        def init() -> None:
            try:
                box["channel"] = _init(self.plan, 0)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc

        thread = threading.Thread(target=init, name="sao-dp-init", daemon=True)
        thread.start()
        while thread.is_alive():
            done, _ = ray.wait(self.runs, timeout=1.0)
            if done:  # a follower ended before the group formed: its error says why
                ray.get(done)
                raise RuntimeError("a learner rank ended before joining rank 0")
        if "error" in box:
            raise box["error"]
        return box["channel"]

    def __exit__(self, *exc: object) -> None:
        import ray

        self.tell_stop()
        failed: list[str] = []
        for rank, run in enumerate(self.runs, start=1):
            try:
                self.calls.append(ray.get(run, timeout=60))
            except Exception as err:  # noqa: BLE001 - reported below
                failed.append(f"rank {rank}: {type(err).__name__}: {str(err)[:300]}")
        self._kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        if failed and exc[0] is None:
            raise RuntimeError(f"learner ranks failed: {'; '.join(failed)}")

    def _kill(self) -> None:
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor, no_restart=True)
        self.actors = []
