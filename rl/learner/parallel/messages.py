"""Rank 0's messages to the follower ranks (:mod:`sao.rl.learner.parallel.ranks`), one frozen record per kind.

A learner call (:data:`Call`) carries its arguments and runs itself on an algorithm: rank 0 sends it and
then runs it on its own learner, a follower runs the one it received, so every rank makes the same
call, by its class, never by a method name in a string. :class:`ShareState` is followed by the
learner's weights and optimizer states (``broadcast_learner``); :class:`Stop` ends a follower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from sao.rl.learner.learner import Learner


@dataclass(frozen=True)
class Update:
    """One training step on ``batch`` (``algo.update``)."""

    batch: Any

    def run(self, algo: Any, learner: Learner) -> dict[str, float]:
        return algo.update(learner, self.batch)


@dataclass(frozen=True)
class PretrainCritic:
    """One value-pretraining step on ``batch`` (``algo.pretrain_critic``)."""

    batch: Any

    def run(self, algo: Any, learner: Learner) -> dict[str, float]:
        return algo.pretrain_critic(learner, self.batch)


@dataclass(frozen=True)
class Begin:
    """RolloutPipe: a step's first part is coming (``algo.begin``)."""

    def run(self, algo: Any, learner: Learner) -> None:
        algo.begin(learner)


@dataclass(frozen=True)
class Accumulate:
    """RolloutPipe: one part of the step's batch (``algo.accumulate``)."""

    batch: Any

    def run(self, algo: Any, learner: Learner) -> None:
        algo.accumulate(learner, self.batch)


@dataclass(frozen=True)
class Finish:
    """RolloutPipe: the step's parts are in; take the optimizer step (``algo.finish``)."""

    def run(self, algo: Any, learner: Learner) -> dict[str, float]:
        return algo.finish(learner)


@dataclass(frozen=True)
class ShareState:
    """Take rank 0's algorithm state, then its learner (broadcast right after this message)."""

    algo_state: dict[str, Any]


@dataclass(frozen=True)
class Stop:
    """Rank 0 is done: the follower returns."""


Call = Union[Update, PretrainCritic, Begin, Accumulate, Finish]
"""A learner call, the same on every rank."""
CALLS: tuple[type, ...] = (Update, PretrainCritic, Begin, Accumulate, Finish)
Message = Union[Update, PretrainCritic, Begin, Accumulate, Finish, ShareState, Stop]
MESSAGES: tuple[type, ...] = (*CALLS, ShareState, Stop)
