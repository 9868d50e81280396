"""Starting the learner's data-parallel ranks on this machine (``learner.world_size > 1``).

:class:`LearnerRanks` spawns ranks 1..N-1 as processes (``spawn``: a fresh interpreter each, no
forked CUDA or thread state), joins them in a ``torch.distributed`` process group with rank 0 (this
process), and hands rank 0 its :class:`~sao.rl.learner.parallel.data_parallel.DataParallel` and the
:class:`~sao.rl.learner.parallel.ranks.Channel` to the followers. Backend: NCCL when the run's device is CUDA with
a GPU per rank, gloo otherwise (``learner.backend`` forces one). The ranks share the machine's cores:
each gets ``learner.threads`` torch threads (default: cores / world_size).

With ``cluster=ray`` the followers are Ray actors on the cluster's nodes instead
(:class:`sao.rl.cluster.learner_ranks.RayLearnerRanks`, chosen by :func:`learner_ranks`); what runs inside a
rank (:func:`serve_rank`, then :func:`sao.rl.learner.parallel.ranks.follow`) does not change.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from sao.rl.config import TrainConfig
from sao.rl.errors import ConfigError
from sao.rl.learner.learner import Learner
from sao.rl.learner.parallel.data_parallel import DataParallel
from sao.rl.learner.parallel.messages import Stop
from sao.rl.learner.parallel.ranks import Channel, LeaderAlgorithm, exit_with_parent, follow
from sao.rl.learner.sharding import make_sharding, require_trainer_support
from sao.sandboxes.capacity import usable_cores

log = logging.getLogger(__name__)

# A collective of the update waits on the slowest rank's share: minutes at most. The followers'
# wait for rank 0's next message spans a whole rollout (a SWE batch can take an hour).
STEP_TIMEOUT = timedelta(minutes=30)
MESSAGE_TIMEOUT = timedelta(hours=12)


@dataclass(frozen=True)
class RankPlan:
    world_size: int
    backend: str  # gloo | nccl
    init_method: str
    threads: int

    def device(self, rank: int) -> str:
        return f"cuda:{rank}" if self.backend == "nccl" else "cpu"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(cfg: TrainConfig) -> RankPlan:
    n, backend = cfg.learner.world_size, cfg.learner.backend
    cuda = cfg.device in ("auto", "cuda") and torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda and torch.cuda.device_count() >= n else "gloo"
    if backend == "nccl" and (not cuda or torch.cuda.device_count() < n):
        raise ConfigError(f"learner.backend=nccl needs a GPU a rank: {n} ranks, "
                          f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} GPU(s)")
    return RankPlan(n, backend, f"tcp://127.0.0.1:{_free_port()}", rank_threads(cfg, usable_cores()))


def rank_threads(cfg: TrainConfig, default: int) -> int:
    """Torch threads of each learner rank: ``learner.threads``, else ``default`` (one rank) or the
    cores shared among the ranks."""
    if cfg.learner.threads:
        return cfg.learner.threads
    n = cfg.learner.world_size
    return default if n == 1 else max(1, usable_cores() // n)


def _init(p: RankPlan, rank: int) -> Channel:
    dist.init_process_group(p.backend, init_method=p.init_method, rank=rank, world_size=p.world_size,
                            timeout=STEP_TIMEOUT)
    return Channel(dist.new_group(backend="gloo", timeout=MESSAGE_TIMEOUT))


def _follower(rank: int, cfg: TrainConfig, model_path: str, p: RankPlan) -> None:
    """Rank ``rank`` >= 1 as a process of this machine (its entry point)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank} %(name)s %(levelname)s %(message)s")
    exit_with_parent()
    serve_rank(rank, cfg, model_path, p, device=p.device(rank))


def serve_rank(rank: int, cfg: TrainConfig, model_path: str, p: RankPlan, *, device: str) -> int:
    """Rank ``rank`` >= 1: the same learner as rank 0's on ``device``, running rank 0's calls until
    it stops; returns the calls run. The body of a follower process or Ray actor alike."""
    from sao.rl.algos import make_algorithm
    from sao.rl.learner.memory import configure_allocator
    from sao.rl.training.build import make_learner

    configure_allocator()
    torch.set_num_threads(p.threads)
    torch.manual_seed(cfg.seed)
    if p.backend == "nccl":
        torch.cuda.set_device(torch.device(device))
    channel = _init(p, rank)
    try:
        algo = make_algorithm(cfg.algo)
        learner = make_learner(cfg, model_path, algo.uses_critic, data_parallel=DataParallel(), device=device)
        calls = follow(learner, algo, channel)
        log.info("rank %d: done after %d learner calls", rank, calls)
        return calls
    finally:
        dist.destroy_process_group()


def learner_ranks(cfg: TrainConfig, model_path: str, *, host: str | None = None) -> Any:
    """The follower ranks of ``learner.world_size > 1``: processes of this machine (``cluster=local``),
    or Ray actors reaching rank 0 at ``host``, this node's IP (``cluster=ray``). A ``learner.sharding``
    the trainer cannot run yet (fsdp2, sao.rl.learner.sharding) is refused here, before any rank starts."""
    require_trainer_support(make_sharding(cfg.learner.sharding))
    if cfg.cluster.kind == "ray":
        from sao.rl.cluster.learner_ranks import RayLearnerRanks

        return RayLearnerRanks(cfg, model_path, host=host)
    return LearnerRanks(cfg, model_path)


class RankZero:
    """What rank 0 does the same whoever started its followers (processes here, or Ray actors:
    :class:`~sao.rl.cluster.learner_ranks.RayLearnerRanks`): its device, its data-parallel view, leading the
    followers, and telling them to stop. A subclass sets ``plan`` and, once the group exists, ``channel``."""

    plan: RankPlan
    channel: Channel | None = None

    @property
    def device(self) -> str:
        return self.plan.device(0)

    def data_parallel(self) -> DataParallel:
        return DataParallel()

    def lead(self, algo: Any, learner: Learner) -> LeaderAlgorithm:
        """Rank 0's algorithm, after every rank has taken rank 0's initial learner state."""
        assert self.channel is not None
        leader = LeaderAlgorithm(algo, self.channel, learner)
        leader.share()
        return leader

    def tell_stop(self) -> None:
        """Send the followers :class:`Stop`; a follower that died cannot be told (the caller ends it)."""
        try:
            if self.channel is not None:
                self.channel.send(Stop())
        except Exception as err:  # noqa: BLE001 - a dead follower is ended by the caller
            log.warning("learner ranks: could not send stop (%s)", err)


class LearnerRanks(RankZero):
    """The follower ranks of a run, started on enter and stopped on exit (module doc)."""

    def __init__(self, cfg: TrainConfig, model_path: str) -> None:
        self.cfg, self.model_path = cfg, model_path
        self.plan = plan(cfg)
        self.processes: list[Any] = []
        self.channel = None

    def __enter__(self) -> LearnerRanks:
        p = self.plan
        ctx = multiprocessing.get_context("spawn")
        for rank in range(1, p.world_size):
            proc = ctx.Process(target=_follower, args=(rank, self.cfg, self.model_path, p), daemon=True,
                               name=f"sao-learner-rank{rank}")
            proc.start()
            self.processes.append(proc)
        # rank 0's own torch work runs on the run's TorchThread, which has p.threads (sao.rl.training.build)
        if p.backend == "nccl":
            torch.cuda.set_device(0)
        self.channel = _init(p, 0)
        log.info("learner: %d data-parallel ranks (%s, %d threads each; followers pid %s)", p.world_size,
                 p.backend, p.threads, ", ".join(str(x.pid) for x in self.processes))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tell_stop()
        for proc in self.processes:
            proc.join(timeout=60)
            if proc.is_alive():
                log.warning("learner rank %s did not stop; terminating it", proc.name)
                proc.terminate()
                proc.join(timeout=10)
        failed = [p.name for p in self.processes if p.exitcode not in (0, None)]
        if dist.is_initialized():
            dist.destroy_process_group()
        if failed and exc[0] is None:
            raise RuntimeError(f"learner ranks {failed} exited with an error (see the run's log)")
