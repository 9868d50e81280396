"""The records a rollout scheduler speaks: prompts, events in, actions out, and its configuration.

A scheduler is a clock-agnostic state machine (:class:`Scheduler`). A *driver* -- the discrete-event
simulator in :mod:`sao.rl.rollout.sim.simulator`, or an asyncio loop over real vLLM replicas and a learner --
feeds it :data:`Event` records stamped with the driver's clock (``now``, seconds) and executes the
:data:`Action` records it returns, in order. A scheduler never sleeps, reads a clock or does I/O.

Driver contract (what each action means and which event must come back):

* :class:`StartTrajectory` -- run one episode of ``prompt`` on ``replica``; when it ends, send
  :class:`TrajectoryFinished` with the policy version of every turn (or token) it sampled.
  The episode's data stays with the driver, keyed by ``traj_id``.
* :class:`SyncReplica` -- pause ``replica`` (its in-flight requests wait), load weights ``version``,
  resume; then send :class:`SyncDone`. Schedulers that keep C1 (one version per trajectory) only
  issue it to replicas with nothing in flight.
* :class:`TrainOn` -- append to the trainer's FIFO. The trainer runs them in order (a gradient
  accumulation micro-batch each); after one with ``final=True`` it takes the optimizer step and
  sends :class:`TrainStepDone` with the new version ``step + 1``.
* :class:`MoveTrajectory` -- ``multi_version`` with ``rebalance``: cancel the running episode on
  ``from_replica`` and continue it on ``to_replica``, which serves the same ``version`` (C1), from its
  prompt plus every token generated so far (the target prefills that prefix again), keeping the
  per-token versions and log-probs; no event answers it (the episode's end still sends
  :class:`TrajectoryFinished`). ``sao-sim`` and the real driver (:mod:`sao.rl.rollout.moves`) execute it.
* :class:`Discard` -- forget the finished trajectory's data (it was dropped, e.g. too stale).
* :class:`Requeue` and :class:`RecordFailed` -- informational: the attempt will not be trained;
  a re-queued prompt comes back later as a new :class:`StartTrajectory` (``attempt + 1``), a failed
  one is written down with its cause ("a bad rollout is data, not a crash").
* Health: send :class:`ReplicaDied` when a replica is lost (its in-flight episodes are then
  considered gone; a late :class:`TrajectoryFinished` for them is ignored) and
  :class:`ReplicaRestarted` when it is back (the scheduler then syncs it).

Versions: the learner starts at version 0; the optimizer step number ``s`` (0-based) turns version
``s`` into ``s + 1``. Staleness of a trained trajectory = the learner's version when it is trained
(``TrainOn.step``) minus the OLDEST version that produced any of its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, Union

from sao.hints import did_you_mean
from sao.rl.errors import ConfigError, LedgerError, RolloutError  # defined there; re-exported here


def unknown_name(kind: str, name: str, known: list[str] | tuple[str, ...]) -> ConfigError:
    """A :class:`ConfigError` for an unknown name that suggests the closest known one."""
    hint = did_you_mean(name, known, clause=True)
    return ConfigError(f"unknown {kind} {name!r}{hint} (known: {', '.join(known)})")


# ---------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Prompt:
    """One rollout request: sample ``index`` of group ``group_id`` (GRPO groups share a prompt).

    With group size 1 (SAO) ``index`` is 0 and ``group_id`` names the prompt. ``attempt`` counts
    earlier attempts of this same request (a re-queued request comes back with ``attempt + 1``).
    ``family`` names the task family (for curricula and online learning).
    """

    group_id: int
    index: int = 0
    family: str = "default"
    attempt: int = 0

    @property
    def key(self) -> tuple[int, int]:
        """The request's identity across attempts."""
        return (self.group_id, self.index)

    def retry(self) -> Prompt:
        return Prompt(self.group_id, self.index, self.family, self.attempt + 1)


class PromptSource(Protocol):
    """Where new prompts come from: a dataset iterator in a real run, a counter in the simulator."""

    def next_group(self, size: int) -> tuple[Prompt, ...]:
        """The ``size`` samples of the next group (one prompt, ``size`` requests)."""
        ...


class CountingPrompts:
    """Group ids 0, 1, 2, ... cycling over ``families``: the simulator's endless dataset."""

    def __init__(self, families: tuple[str, ...] = ("default",)) -> None:
        self._families = families
        self._next = 0

    def next_group(self, size: int) -> tuple[Prompt, ...]:
        gid = self._next
        self._next += 1
        family = self._families[gid % len(self._families)]
        return tuple(Prompt(gid, i, family) for i in range(size))


# ---------------------------------------------------------------- events (driver -> scheduler)


@dataclass(frozen=True)
class TrajectoryFinished:
    """Episode ``traj_id`` ended. ``versions``: the policy version of each turn (or token) it
    sampled, in order (a trajectory spans several when weights changed under it). ``failed``: the
    episode broke (engine error, environment error); ``cause`` says why."""

    traj_id: int
    versions: tuple[int, ...]
    n_tokens: int = 0
    failed: bool = False
    cause: str = ""


@dataclass(frozen=True)
class TrainStepDone:
    """The optimizer step finished; the learner's weights are now ``version``."""

    version: int


@dataclass(frozen=True)
class SyncDone:
    """``replica`` now serves weights ``version`` and has resumed."""

    replica: int
    version: int


@dataclass(frozen=True)
class ReplicaDied:
    """``replica`` is gone with everything in flight on it."""

    replica: int
    cause: str = "replica died"


@dataclass(frozen=True)
class ReplicaRestarted:
    """``replica`` is back (with unknown weights; the scheduler syncs it before use)."""

    replica: int


Event = Union[TrajectoryFinished, TrainStepDone, SyncDone, ReplicaDied, ReplicaRestarted]


# ---------------------------------------------------------------- actions (scheduler -> driver)


@dataclass(frozen=True)
class StartTrajectory:
    """Run ``prompt`` on ``replica``, which the scheduler believes serves ``version``."""

    traj_id: int
    prompt: Prompt
    replica: int
    version: int


@dataclass(frozen=True)
class TrainOn:
    """Train on ``traj_ids`` (finished, in this order) at learner version ``step``. ``final``:
    this micro-batch ends the optimizer step (the driver then sends ``TrainStepDone(step + 1)``)."""

    step: int
    traj_ids: tuple[int, ...]
    final: bool = True


@dataclass(frozen=True)
class SyncReplica:
    """Pause ``replica``, load weights ``version``, resume; answer with :class:`SyncDone`."""

    replica: int
    version: int


@dataclass(frozen=True)
class Discard:
    """Drop the finished trajectory's data; it will not be trained (``reason`` says why)."""

    traj_id: int
    reason: str


@dataclass(frozen=True)
class Requeue:
    """Attempt ``traj_id`` of ``prompt`` ended untrained; the request will be admitted again."""

    traj_id: int
    prompt: Prompt
    cause: str


@dataclass(frozen=True)
class RecordFailed:
    """Attempt ``traj_id`` of ``prompt`` failed for good; write it down with ``cause``."""

    traj_id: int
    prompt: Prompt
    cause: str


@dataclass(frozen=True)
class MoveTrajectory:
    """Cancel running trajectory ``traj_id`` on ``from_replica`` and continue it on ``to_replica``; both
    serve ``version`` (the trajectory's one version, C1). Sent to empty an old-version replica so it can
    upgrade at once (DORA's rebalancing, METHOD.md 2)."""

    traj_id: int
    from_replica: int
    to_replica: int
    version: int


Action = Union[StartTrajectory, TrainOn, SyncReplica, Discard, Requeue, RecordFailed, MoveTrajectory]


# ---------------------------------------------------------------- configuration

STALE_POLICIES = ("drop", "mask")


@dataclass(frozen=True)
class SchedulerConfig:
    """What every mode shares. Sizes count trajectories (a GRPO batch of 16 prompts x 8 is 128).

    batch_size:        trajectories per optimizer step (a multiple of ``group_size``).
    group_size:        samples per prompt (1 = single-rollout SAO; G for GRPO and ``pipe``).
    max_concurrency:   trajectories one replica runs at once (KV-cache bound; vLLM ``max_num_seqs``).
    staleness:         k, the bound on learner version minus oldest token version (METHOD 1.10, C3).
    stale_policy:      ``async`` only: ``drop`` (default: re-queue a too-stale trajectory's prompt,
                       so C3 holds) or ``mask`` (train it; the learner's DIS mask handles the
                       off-policy tokens; C3 does not hold). ``drop`` falls on long trajectories
                       (they finish late), which C2 forbids: in ``sao-sim`` it trained trajectories
                       45% shorter than generated ones. ``multi_version`` keeps both.
    max_failures:      failed attempts (replica death, broken episode) before a request is recorded
                       failed instead of re-queued. Stale drops do not count.
    micro_groups:      ``pipe``: complete groups per trainer micro-batch.
    frontier_first:    ``pipe``: FGD on (admit the frontier group's requests first) or off.
    async_outstanding: ``async``: at most this many batches' worth of trajectories in flight or
                       waiting for the trainer (AReaL-style admission control; open, default k + 1,
                       the same cap ``multi_version`` reaches by construction).
    admit_lag:         ``multi_version``: a replica may still start new trajectories while its
                       version is at most this many steps behind the learner. 0 (default) is
                       METHOD.md 2's rule: new trajectories start only on the newest version; old
                       replicas finish their in-flight work, then upgrade. N > 0 lets overflow
                       start on replicas up to N versions behind (at most k).
    drain_below:       ``multi_version``: an old-version replica whose load falls to this fraction
                       of ``max_concurrency`` stops admitting and drains, so it upgrades soon. With
                       ``rebalance`` it is also the "few stragglers" bound of a replica to empty.
    rebalance:         ``multi_version``: move running trajectories between replicas of one old
                       version (:class:`MoveTrajectory`) so that a draining replica holding at most
                       ``drain_below * max_concurrency`` of them empties into its peers and upgrades at
                       once, instead of idling on one long straggler. Off by default; ``sao-sim`` and
                       the real driver (:mod:`sao.rl.rollout.moves`) execute the move
                       (docs/results/dora-rebalancing.md).
    """

    batch_size: int = 128
    group_size: int = 1
    max_concurrency: int = 32
    staleness: int = 4
    stale_policy: str = "drop"
    max_failures: int = 3
    micro_groups: int = 1
    frontier_first: bool = True
    async_outstanding: float | None = None
    admit_lag: int = 0
    drain_below: float = 0.25
    rebalance: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.group_size < 1 or self.max_concurrency < 1:
            raise ConfigError("batch_size, group_size and max_concurrency must be >= 1, got "
                              f"{self.batch_size}, {self.group_size}, {self.max_concurrency}")
        if self.batch_size % self.group_size:
            raise ConfigError(f"batch_size {self.batch_size} is not a multiple of group_size {self.group_size}; "
                              "a batch holds whole groups")
        if self.staleness < 0:
            raise ConfigError(f"staleness must be >= 0, got {self.staleness}")
        if self.stale_policy not in STALE_POLICIES:
            raise unknown_name("stale policy", self.stale_policy, STALE_POLICIES)
        if self.max_failures < 1 or self.micro_groups < 1:
            raise ConfigError("max_failures and micro_groups must be >= 1")
        if not 0 <= self.admit_lag <= self.staleness:
            raise ConfigError(f"admit_lag must lie in [0, staleness={self.staleness}], got {self.admit_lag}")
        if self.async_outstanding is not None and self.async_outstanding < 1:
            raise ConfigError(f"async_outstanding must be >= 1 batch, got {self.async_outstanding}")
        if not 0.0 <= self.drain_below <= 1.0:
            raise ConfigError(f"drain_below is a fraction in [0, 1], got {self.drain_below}")
        if not isinstance(self.rebalance, bool):
            raise ConfigError(f"rebalance is true or false, got {self.rebalance!r}")

    @property
    def groups_per_batch(self) -> int:
        return self.batch_size // self.group_size

    @property
    def outstanding_limit(self) -> int:
        """``async``: the cap on trajectories in flight or finished-untrained."""
        batches = self.staleness + 1 if self.async_outstanding is None else self.async_outstanding
        return max(self.batch_size, int(round(max(batches, 1.0) * self.batch_size)))


class ReplicaStatus(str, Enum):
    """SERVING admits work; DRAINING finishes its in-flight work without admitting (then upgrades);
    SYNCING is paused while loading weights; DEAD is gone until :class:`ReplicaRestarted`."""

    SERVING = "serving"
    DRAINING = "draining"
    SYNCING = "syncing"
    DEAD = "dead"


class Scheduler(Protocol):
    """A rollout mode. Feed it events, execute what it returns; it never touches a clock.

    ``start`` is called once; ``on_event`` for every event, in the order they happened, with the
    driver's clock. ``stats`` returns counters (namespaced keys) for the metrics sink; ``check``
    raises :class:`LedgerError` when an accounting invariant is broken.
    """

    name: str

    def start(self, now: float) -> list[Action]: ...

    def on_event(self, event: Event, now: float) -> list[Action]: ...

    def stats(self) -> dict[str, float]: ...

    def check(self) -> None: ...
