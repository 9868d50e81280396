"""The registry of rollout modes: a name in the config picks one small scheduler class."""

from __future__ import annotations

from collections.abc import Callable

from sao.rl.rollout.schedulers.batched import OneStepOffScheduler, PipeScheduler, SyncScheduler
from sao.rl.rollout.schedulers.core import PromptSource, Scheduler, SchedulerConfig, unknown_name
from sao.rl.rollout.schedulers.streaming import AsyncScheduler, MultiVersionScheduler

SchedulerFactory = Callable[..., Scheduler]  # (config, n_replicas, source, start_version) -> Scheduler

MODES: dict[str, SchedulerFactory] = {
    "sync": SyncScheduler,
    "one_step_off": OneStepOffScheduler,
    "async": AsyncScheduler,
    "multi_version": MultiVersionScheduler,
    "pipe": PipeScheduler,
}


def make_scheduler(mode: str, config: SchedulerConfig, n_replicas: int,
                   source: PromptSource | None = None, start_version: int = 0) -> Scheduler:
    """The scheduler of ``mode`` over ``n_replicas`` replicas (unknown names suggest the closest),
    starting at learner version ``start_version`` (a resumed run's checkpoint step)."""
    if mode not in MODES:
        raise unknown_name("rollout mode", mode, tuple(MODES))
    return MODES[mode](config, n_replicas, source, start_version)
