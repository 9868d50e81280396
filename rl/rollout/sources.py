"""Where the learner's trajectories come from: the :class:`RolloutSource` seam.

The trainer asks a source for the next batch and tells it when new weights are live::

    batch = await source.next_batch(n_trajectories, learner_version)   # finished, rewarded trajectories
    ... update ...
    await weight_sync.sync(policy, version + 1)
    source.on_weights(version + 1)

Every rollout mode, ``sync`` included, is one source behind that seam: the rollout driver
(:class:`~sao.rl.rollout.orchestrated.OrchestratedRollout`) running the mode's scheduler over the engine
replicas. The protocols below say what else a source may offer (batches in parts, a schedule of its
own, forgetting probes); the trainer asks for them by protocol, not by class.

Failed episodes (the environment raised, the engine failed) come back in ``RolloutBatch.failed``,
recorded on disk like every other episode, and are not trained on: their reward says nothing about
the policy.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sao.agents import RolloutMeta, Trajectory
from sao.rl.prompts import PromptRef

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutBatch:
    """What a source hands the learner: the trajectories to train on, and the ones that failed."""

    trajectories: tuple[Trajectory, ...]  # status "ok", in prompt order (samples of a prompt adjacent)
    failed: tuple[Trajectory, ...] = ()
    prompts: tuple[PromptRef, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def join(cls, parts: Sequence[RolloutBatch]) -> RolloutBatch:
        """One step's parts (released one by one, e.g. RolloutPipe's complete groups) as one batch;
        the last part carries the step's metrics."""
        return cls(tuple(t for p in parts for t in p.trajectories), tuple(t for p in parts for t in p.failed),
                   tuple(r for p in parts for r in p.prompts), parts[-1].metrics)


def rollout_meta(trajectory: Trajectory) -> RolloutMeta:
    """The rollout metadata every source stamps on its trajectories (ValueError where it is missing)."""
    if trajectory.rollout is None:
        raise ValueError(f"trajectory {trajectory.episode_id!r} carries no rollout metadata: "
                         "a rollout source must stamp RolloutMeta on what it returns")
    return trajectory.rollout


class RolloutSource(Protocol):
    """What the trainer needs from every source. It sets ``on_trajectory`` to record each episode as
    it ends (failed ones included)."""

    on_trajectory: Callable[[Trajectory], None]

    async def next_batch(self, n: int, learner_version: int) -> RolloutBatch: ...

    def on_weights(self, version: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class StreamingSource(RolloutSource, Protocol):
    """A source that can release a step's batch in parts, to be trained as they arrive (``rollout=pipe``:
    complete groups); ``streams_parts`` says whether its parts are worth it."""

    @property
    def streams_parts(self) -> bool: ...

    def next_parts(self, n: int, learner_version: int) -> AsyncIterator[RolloutBatch]: ...


@runtime_checkable
class ScheduledSource(RolloutSource, Protocol):
    """A source that runs a schedule of its own (the rollout driver): critic warm-up batches outside
    the schedule, its ledger and replicas as metrics, and tasks to stop at the end."""

    async def warmup_batch(self, n: int, learner_version: int) -> RolloutBatch: ...

    def stats(self) -> dict[str, float]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ProbingSource(RolloutSource, Protocol):
    """A source that can run episodes that measure and are never trained on (forgetting probes)."""

    async def evaluate(self, prompts: list[PromptRef]) -> list[Trajectory]: ...


def rollout_metrics(all_: list[Trajectory] | tuple[Trajectory, ...], ok: tuple[Trajectory, ...], wall_s: float
                    ) -> dict[str, float]:
    """Per-batch rollout figures. Rewards and accuracy are over the trajectories trained on."""
    tokens = sum(t.num_action_tokens for t in all_)
    n_ok = max(len(ok), 1)
    return {
        "reward/mean": sum(t.reward for t in ok) / n_ok if ok else float("nan"),
        "reward/accuracy": sum(t.correct for t in ok) / n_ok if ok else float("nan"),
        "rollout/trajectories": float(len(all_)),
        "rollout/failed": float(len(all_) - len(ok)),
        "rollout/truncated_frac": sum(t.truncated for t in ok) / n_ok,
        "rollout/response_tokens_mean": sum(t.num_action_tokens for t in ok) / n_ok,
        "rollout/turns_mean": sum(len(t.turns) for t in ok) / n_ok,
        "rollout/tool_calls_mean": sum(t.num_tool_calls for t in ok) / n_ok,
        "rollout/tokens": float(tokens),
        "perf/rollout_s": wall_s,
        "perf/rollout_tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        **episode_time_metrics(all_),
    }


def episode_time_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Where an episode's time went, means over the batch's episodes (failed ones included), under
    ``perf/`` with the other wall-clock figures (they differ run to run): ``perf/agent_s`` in model
    calls, ``perf/env_s`` the rest (reset, tools, grading), and ``perf/env_<key>`` for each number the
    environment reports in ``info["timing"]`` (over the episodes
    that report it; the SWE envs: ``reset_s`` = ``image_s`` + ``container_start_s`` + ``workspace_s``,
    ``tools_s``, and for the episodes the environment ended ``diff_s`` and ``grading_s``, 0 without a diff)."""
    if not trajectories:
        return {}
    agent = [sum(turn.t_end - turn.t_start for turn in t.turns) for t in trajectories]
    out = {"perf/agent_s": sum(agent) / len(agent),
           "perf/env_s": sum(t.wall_s - a for t, a in zip(trajectories, agent)) / len(agent)}
    reported: dict[str, list[float]] = {}
    for t in trajectories:
        timing = t.info.get("timing")
        for key, value in (timing.items() if isinstance(timing, dict) else ()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                reported.setdefault(f"perf/env_{key}", []).append(float(value))
    return out | {key: sum(v) / len(v) for key, v in sorted(reported.items())}
