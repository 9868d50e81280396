"""The ranks of a data-parallel learner (``learner.world_size > 1``): rank 0 leads, the others follow.

Rank 0 runs the whole trainer (rollouts, weight sync, logs, checkpoints) with a :class:`LeaderAlgorithm`:
every learner call the trainer makes (``update``, ``pretrain_critic``, and RolloutPipe's ``begin`` /
``accumulate`` / ``finish``) is first sent, with its batch, to the followers, and then run on rank 0;
the messages are typed records (:mod:`sao.rl.learner.parallel.messages`).
Each follower (:func:`follow`) runs the same call on its own copy of the learner, so every rank takes
the same collective steps in the same order (sao.rl.learner.parallel.data_parallel does the sharding and the sums).
The messages go over a gloo group of their own, so that the gradients may use NCCL on GPUs.

The learner's state (weights, optimizer and lr-schedule states) is rank 0's: it is broadcast once at
the start (so that a randomly initialised value head is the same everywhere) and again after a
resume, when rank 0 has loaded its checkpoint; a follower never reads the run folder, so ranks on
other machines need no shared filesystem. Checkpoints are written by rank 0 only: the ranks'
states are equal after every step.

A follower exits with rank 0: on the :class:`Stop` message, and on its own when rank 0's process is gone (a
watchdog polls the parent pid), so a SIGKILLed run leaves no rank behind waiting in a collective.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from sao.rl.learner.learner import Learner
from sao.rl.learner.parallel.messages import (
    CALLS,
    MESSAGES,
    Accumulate,
    Begin,
    Call,
    Finish,
    Message,
    PretrainCritic,
    ShareState,
    Stop,
    Update,
)

log = logging.getLogger(__name__)


class Channel:
    """Rank 0's messages to every other rank (a pickled object per message, gloo broadcast)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.rank = dist.get_rank()

    def send(self, message: Message) -> None:
        if not isinstance(message, MESSAGES):
            raise TypeError(f"not a message record: {type(message).__name__} "
                            f"(known: {', '.join(m.__name__ for m in MESSAGES)})")
        dist.broadcast_object_list([message], src=0, group=self.group)

    def recv(self) -> Message:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def _optim_states(learner: Learner) -> list[Any]:
    states = [learner.policy_optimizer.state_dict(), learner.policy_scheduler.state_dict()]
    if learner.value_model is not None:
        states += [learner.value_optimizer.state_dict(), learner.value_scheduler.state_dict()]
    return states


def _load_optim_states(learner: Learner, states: list[Any]) -> None:
    learner.policy_optimizer.load_state_dict(states[0])
    learner.policy_scheduler.load_state_dict(states[1])
    if learner.value_model is not None:
        learner.value_optimizer.load_state_dict(states[2])
        learner.value_scheduler.load_state_dict(states[3])


def broadcast_learner(learner: Learner, channel: Channel) -> None:
    """Make every rank's learner rank 0's: weights (in place, tensor by tensor, over the default
    group) and the optimizers' and schedules' states (pickled, over the channel's group)."""
    modules = [learner.policy] + ([learner.value_model] if learner.value_model is not None else [])
    with torch.no_grad():
        for module in modules:
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)
    box = [_optim_states(learner) if channel.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=channel.group)
    if channel.rank != 0:
        _load_optim_states(learner, box[0])


class LeaderAlgorithm:
    """Rank 0's algorithm: each learner call goes to the followers first, then runs here."""

    def __init__(self, algo: Any, channel: Channel, learner: Learner) -> None:
        self.algo, self.channel, self.learner = algo, channel, learner
        self.uses_critic = algo.uses_critic
        self.streams = bool(getattr(algo, "streams", False))

    def _call(self, call: Call, learner: Learner) -> Any:
        self.channel.send(call)
        return call.run(self.algo, learner)

    def update(self, learner: Learner, batch: Any) -> dict[str, float]:
        return self._call(Update(batch), learner)

    def pretrain_critic(self, learner: Learner, batch: Any) -> dict[str, float]:
        return self._call(PretrainCritic(batch), learner)

    def begin(self, learner: Learner) -> None:
        self._call(Begin(), learner)

    def accumulate(self, learner: Learner, batch: Any) -> None:
        self._call(Accumulate(batch), learner)

    def finish(self, learner: Learner) -> dict[str, float]:
        return self._call(Finish(), learner)

    def state_dict(self) -> dict[str, Any]:
        return self.algo.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resume: rank 0 has loaded its checkpoint into the learner; every rank takes it."""
        self.algo.load_state_dict(state)
        self.share(state)

    def share(self, algo_state: dict[str, Any] | None = None) -> None:
        """Broadcast rank 0's learner (and the algorithm's state) to the followers."""
        self.channel.send(ShareState(algo_state if algo_state is not None else self.algo.state_dict()))
        broadcast_learner(self.learner, self.channel)


def follow(learner: Learner, algo: Any, channel: Channel) -> int:
    """A follower's loop: run rank 0's learner calls until it says stop; returns the calls run."""
    calls = 0
    while True:
        message = channel.recv()
        if isinstance(message, Stop):
            return calls
        if isinstance(message, ShareState):
            algo.load_state_dict(message.algo_state)
            broadcast_learner(learner, channel)
        elif isinstance(message, CALLS):
            message.run(algo, learner)
            calls += 1
        else:
            raise RuntimeError(f"rank {channel.rank}: unknown message from rank 0: {type(message).__name__}")


def exit_with_parent(poll_s: float = 2.0) -> threading.Thread:
    """A daemon thread that ends this process when its parent (rank 0) is gone."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                log.error("rank 0 (pid %d) is gone; this rank exits", parent)
                os._exit(1)

    thread = threading.Thread(target=watch, name="sao-dp-watchdog", daemon=True)
    thread.start()
    return thread
