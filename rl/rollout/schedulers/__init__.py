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

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "batched": ["OneStepOffScheduler", "PipeScheduler", "SyncScheduler"],
        "core": ["Action", "ConfigError", "CountingPrompts", "Discard", "Event", "LedgerError", "MoveTrajectory", "Prompt",
                 "PromptSource", "RecordFailed", "ReplicaDied", "ReplicaRestarted", "ReplicaStatus", "Requeue",
                 "RolloutError", "STALE_POLICIES", "Scheduler", "SchedulerConfig", "StartTrajectory", "SyncDone",
                 "SyncReplica", "TrainOn", "TrainStepDone", "TrajectoryFinished", "unknown_name"],
        "ledger": ["ClosedCounts", "Ledger", "LedgerCounts"],
        "lengths": ["LengthStats"],
        "modes": ["MODES", "make_scheduler"],
        "replicas": ["UNKNOWN_VERSION"],
        "streaming": ["AsyncScheduler", "MultiVersionScheduler"],
    },
)
