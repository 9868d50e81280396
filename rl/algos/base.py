"""What every algorithm shares: the :class:`Algorithm` seam the trainer calls, the seam of the
algorithms with a critic, the broadcast of a per-trajectory advantage to its action tokens, and the
check that an algorithm is given its own config."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from torch import Tensor

from sao.rl.config import AlgoConfig
from sao.rl.errors import ConfigError
from sao.rl.learner import Batch, Learner

C = TypeVar("C", bound=AlgoConfig)


class Algorithm(Protocol):
    """What the trainer needs from an algorithm."""

    uses_critic: ClassVar[bool]

    def update(self, learner: Learner, batch: Batch) -> dict[str, float]:
        """One policy step (and the critic's steps) on ``batch``; returns metrics."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CriticAlgorithm(Algorithm, Protocol):
    """An algorithm with a value model (``uses_critic`` True): it also trains the critic alone."""

    def pretrain_critic(self, learner: Learner, batch: Batch) -> dict[str, float]:
        """Critic-only steps on ``batch`` before the first policy step (METHOD.md 1.3); returns metrics."""
        ...


def token_advantages(batch: Batch, per_row: Tensor) -> Tensor:
    """A per-trajectory advantage [B] broadcast to its action tokens [B, T] (0 elsewhere)."""
    return per_row.to(batch.action_mask.device)[:, None] * batch.action_mask.float()


def own_config(cfg: AlgoConfig, expected: type[C]) -> C:
    """``cfg`` when it is ``expected`` (an algorithm's own config, :data:`sao.rl.config.ALGO_CONFIGS`);
    a :class:`ConfigError` otherwise (e.g. ``algo.name`` changed under another algorithm's config)."""
    if not isinstance(cfg, expected):
        raise ConfigError(f"algo {cfg.name!r} takes a {expected.__name__}, got a {type(cfg).__name__}; "
                          f"choose the algorithm with algo={cfg.name} (sao.rl.config.algo_config in code)")
    return cfg


@runtime_checkable
class LearnsFromDemonstrations(Protocol):
    """An algorithm whose batches are a scripted demonstrator's episodes, not the engine's (``algo=sft``):
    the run builds a demonstration source (:mod:`sao.rl.warm_start`) instead of the rollout driver, and the
    engine serves only the held-out evaluation."""

    @property
    def demonstrator(self) -> str:
        """The demonstrator's name (:data:`sao.rl.warm_start.DEMONSTRATORS`)."""
        ...

    @property
    def min_reward(self) -> float:
        """The reward a demonstration must have earned to be trained on."""
        ...


class Stateless:
    """The checkpoint state of an algorithm that keeps none between steps."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@runtime_checkable
class PartwiseAlgorithm(Protocol):
    """An algorithm that can take one policy step part by part (GRPO: complete groups carry their own
    baseline), when ``streams``."""

    streams: bool

    def begin(self, learner: Learner) -> None: ...

    def accumulate(self, learner: Learner, batch: Batch) -> None: ...

    def finish(self, learner: Learner) -> dict[str, float]: ...
