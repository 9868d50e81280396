"""What a simulated run reports, and how each number is defined.

Times are simulated seconds; ``wall_s`` runs from the start to the end of the last optimizer step.

* ``trajectories_per_hour``: trained trajectories / ``wall_s`` x 3600 (the same sample budget,
  ``steps x batch_size``, in every mode).
* ``tokens_per_s``: response (action) tokens of trained trajectories / ``wall_s``;
  ``generated_tokens_per_s`` also counts tokens generated for attempts that were never trained.
* ``trainer_idle_ratio``: fraction of ``wall_s`` the trainer is not computing.
* ``trainer_wait_ratio``: fraction of ``wall_s`` the trainer is idle *while some trajectory is
  being generated* -- waiting for rollout data. The rest of its idle time is spent on weight syncs
  with nothing generating (``sync``, ``pipe``) or on replicas that are all down.
* ``engine_busy_ratio``: fraction of replica-time with at least one sequence decoding (not paused,
  not dead). ``engine_utilization``: served decode-token equivalents / (replicas x saturated
  throughput x ``wall_s``): how much of the fleet's peak the run used.
* staleness of a trained trajectory: learner version at train time minus the oldest version among
  its tokens; ``max_staleness``, ``mean_staleness`` and ``staleness_hist`` (lag -> count).
  ``masked``: trained with staleness > k (``async`` with ``mask``). ``mixed_version``: trained
  trajectories whose tokens came from more than one version (C1 says 0 for all but ``async``).
* ``rollout_to_train_end_s``: per optimizer step, from the first start of any request in its batch
  (earliest attempt) to the end of the step; the mean over steps.
* ledger: ``admitted`` (attempts started), ``trained``, ``requeued`` (re-admitted later;
  ``dropped_stale`` of them for staleness), ``failed``, ``killed`` (attempts lost with a replica;
  each is re-queued or failed), and ``lost``: attempts the driver started that are neither
  trained, re-queued, failed, in flight nor waiting for the trainer, plus any counted twice.
  It must be 0.
* ``old_version_starts``: trajectories started on a replica whose version was older than the
  learner's at that moment (``multi_version`` with ``admit_lag > 0``; during syncs in other modes);
  ``old_version_start_share`` = that / ``admitted``.
* prefix cache (:mod:`sao.rl.rollout.sim.routing`): ``prefix_cache_hit_rate``: prompt tokens found
  cached / prompt tokens presented (vLLM's definition; turn-0 prompts are misses);
  ``prefix_turn_hit_rate``: later turns that found any of their prefix / later turns;
  ``routed_moves``: later turns run on another replica than the turn before.
* rebalancing (``multi_version``): ``drain_replica_s``: replica-seconds spent draining -- holding an
  old version and in-flight work while admitting nothing new (the scheduler's DRAINING state, from
  the moment it stops admitting to the moment its sync starts or it dies); ``drain_share`` = that /
  (replicas x ``wall_s``). ``moves``: running trajectories moved to another replica of their version
  (``rebalance``); ``move_prefill_tokens``: prefix tokens the targets of mid-turn moves computed again
  (a move between turns pays its prefix at the next turn's prefill, in the prefix-cache counters).
* ``lengths``: action-token lengths of generated, trained and stale-dropped trajectories
  (:mod:`sao.rl.rollout.schedulers.lengths`: ``rollout/len_{generated,trained,dropped}_{n,mean,p50,p90,long_share}``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Timeline:
    """Activity intervals for the plots: per replica ``(start, end, state)`` with state ``busy``,
    ``idle``, ``sync`` or ``dead``; the trainer's ``(start, end, step)`` compute intervals."""

    engines: dict[int, list[tuple[float, float, str]]]
    trainer: list[tuple[float, float, int]]


@dataclass(frozen=True)
class SimResult:
    """One mode at one scale (definitions in the module docstring)."""

    mode: str
    engines: int
    steps: int
    batch_size: int
    group_size: int
    wall_s: float
    trajectories_per_hour: float
    tokens_per_s: float
    generated_tokens_per_s: float
    trainer_idle_ratio: float
    trainer_wait_ratio: float
    engine_busy_ratio: float
    engine_utilization: float
    max_staleness: int
    mean_staleness: float
    staleness_hist: dict[int, int]
    masked: int
    mixed_version: int
    rollout_to_train_end_s: float
    admitted: int
    trained: int
    requeued: int
    dropped_stale: int
    failed: int
    killed: int
    lost: int
    old_version_starts: int = 0
    old_version_start_share: float = 0.0
    prefix_cache_hit_rate: float = 0.0
    prefix_turn_hit_rate: float = 0.0
    routed_moves: int = 0
    moves: int = 0
    move_prefill_tokens: int = 0
    drain_replica_s: float = 0.0
    drain_share: float = 0.0
    lengths: dict[str, float] = field(default_factory=dict)
    timeline: Timeline | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("timeline")
        out["staleness_hist"] = {str(k): v for k, v in sorted(self.staleness_hist.items())}
        return out
