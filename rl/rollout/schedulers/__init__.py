"""Clock-agnostic schedulers for every rollout mode (their simulator is :mod:`sao.rl.rollout.sim`).

A scheduler is a pure state machine (the :class:`Scheduler` protocol): ``start(now)`` and
``on_event(event, now)`` return the actions to execute; it never sleeps, reads a clock or does I/O.
The same classes drive the discrete-event simulator (:mod:`sao.rl.rollout.sim.simulator`, ``sao-sim``) and a
real asyncio driver over vLLM replicas and the learner (:mod:`sao.rl.rollout`), which would look like this::

    scheduler = make_scheduler("multi_version", SchedulerConfig(batch_size=128), n_replicas=len(engines))
    events: asyncio.Queue[Event] = asyncio.Queue()
    execute(scheduler.start(loop.time()))          # each action spawns a task that later puts
    while not done:                                # its answer event on `events`:
        event = await events.get()                 #   StartTrajectory -> TrajectoryFinished
        execute(scheduler.on_event(event, loop.time()))   # SyncReplica -> SyncDone, TrainOn -> TrainStepDone

One consumer feeds the scheduler, so it needs no locks. The driver contract (what each action
means and which event answers it) is in :mod:`sao.rl.rollout.schedulers.core`.

Modes (:data:`MODES`): ``sync``, ``one_step_off``, ``async`` (SAO), ``multi_version`` (DORA),
``pipe`` (RolloutPipe).

Also pure and clock-agnostic: request routing across replicas (:mod:`~sao.agents.routing.routers`: the
:class:`Router` protocol, ``pinned``, ``round_robin`` and ``cache_aware``; WAR, METHOD.md 3) and
the length distribution of generated, trained and dropped trajectories (:class:`LengthStats`).
"""

from sao.rl.rollout.schedulers.batched import OneStepOffScheduler, PipeScheduler, SyncScheduler
from sao.rl.rollout.schedulers.core import (
    Action,
    ConfigError,
    CountingPrompts,
    Discard,
    Event,
    LedgerError,
    Prompt,
    PromptSource,
    RecordFailed,
    ReplicaDied,
    ReplicaRestarted,
    ReplicaStatus,
    Requeue,
    RolloutError,
    Scheduler,
    SchedulerConfig,
    StartTrajectory,
    SyncDone,
    SyncReplica,
    TrainOn,
    TrainStepDone,
    TrajectoryFinished,
)
from sao.agents.routing.routers import ROUTERS, CacheAware, Pinned, ReplicaView, RoundRobin, RouteRequest, Router, make_router
from sao.rl.rollout.schedulers.ledger import Ledger
from sao.rl.rollout.schedulers.lengths import LengthStats
from sao.rl.rollout.schedulers.modes import MODES, make_scheduler
from sao.rl.rollout.schedulers.streaming import AsyncScheduler, MultiVersionScheduler

__all__ = [
    "Action",
    "AsyncScheduler",
    "CacheAware",
    "ConfigError",
    "CountingPrompts",
    "Discard",
    "Event",
    "Ledger",
    "LedgerError",
    "LengthStats",
    "MODES",
    "MultiVersionScheduler",
    "OneStepOffScheduler",
    "Pinned",
    "PipeScheduler",
    "Prompt",
    "PromptSource",
    "RecordFailed",
    "ReplicaDied",
    "ReplicaRestarted",
    "ROUTERS",
    "ReplicaStatus",
    "ReplicaView",
    "Requeue",
    "RolloutError",
    "RoundRobin",
    "RouteRequest",
    "Router",
    "Scheduler",
    "SchedulerConfig",
    "StartTrajectory",
    "SyncDone",
    "SyncReplica",
    "SyncScheduler",
    "TrainOn",
    "TrainStepDone",
    "TrajectoryFinished",
    "make_router",
    "make_scheduler",
]
