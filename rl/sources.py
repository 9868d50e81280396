"""Where the learner's trajectories come from: the :class:`RolloutSource` seam, and ``rollout=sync``.

The trainer asks a source for the next batch and tells it when new weights are live::

    batch = await source.next_batch(n_trajectories, learner_version)   # finished, rewarded trajectories
    ... update ...
    await weight_sync.sync(policy, version + 1)
    source.on_weights(version + 1)

:class:`SyncRollout` (``rollout=sync``) does the simplest thing behind that seam: it draws the
next prompts, runs ``group_size`` episodes per prompt with bounded concurrency against the engine,
and returns when all of them have ended; the weights never change while it runs, so every token
was sampled by version ``learner_version``, which it stamps on each turn (stock vLLM ``/v1``
responses do not report a version) after checking the engine's own label before and after.
Asynchronous sources (streaming, multi-version, pipelined) implement the same two calls, so the
trainer does not change when they arrive.

Failed episodes (the environment raised, the engine failed) come back in ``RolloutBatch.failed``,
recorded on disk like every other episode, and are not trained on: their reward says nothing about
the policy. With a managed engine, :class:`SyncRollout` takes the run's
:class:`~sao.agents.engine_watch.EngineWatch`: an episode that the engine's death cut is not a
result; it runs again from its start once the engine is back (serving the same version, which
:class:`~sao.rl.watched_sync.WatchedWeightSync` loads into it), and is recorded once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from sao.agents import ChatRenderer, CompletionClient, EpisodeRunner, LoopConfig, RolloutMeta, Trajectory, VersionSpan
from sao.agents.engine_watch import EngineWatch, rerun_on_death, retry_on_death
from sao.rl.tasks import PromptRef, TaskStream, episode_seed
from sao.rl.trainable import failure

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


class VersionedEngine(Protocol):
    async def weight_version(self) -> str | None: ...


class SyncRollout:
    """``rollout=sync``: one batch of episodes per call, all on the current weights (module doc)."""

    def __init__(
        self,
        *,
        client: CompletionClient,
        renderer_for: Callable[[tuple[dict[str, Any], ...]], ChatRenderer],
        engine: VersionedEngine | None,
        env_name: str,
        env_kwargs: dict[str, Any],
        loop: LoopConfig,
        tasks: TaskStream,
        group_size: int,
        concurrency: int,
        seed: int,
        on_trajectory: Callable[[Trajectory], None] = lambda t: None,
        watch: EngineWatch | None = None,
    ):
        self.client, self.engine, self.watch = client, engine, watch
        self.runner = EpisodeRunner(env_name, renderer_for, loop, env_kwargs)
        self.tasks, self.group_size, self.seed = tasks, group_size, seed
        self.on_trajectory = on_trajectory
        self._semaphore = asyncio.Semaphore(concurrency)
        self.version = 0

    def on_weights(self, version: int) -> None:
        self.version = version

    async def evaluate(self, prompts: list[PromptRef]) -> list[Trajectory]:
        """One episode per prompt on the current weights, recorded with ``rollout.probe = True`` and
        never returned by :meth:`next_batch`: for probes that measure, not train (forgetting)."""
        return list(await asyncio.gather(*(self._episode(p, 0, self.version, probe=True) for p in prompts)))

    async def _episode(self, prompt: PromptRef, sample: int, version: int, *, probe: bool = False) -> Trajectory:
        async def attempt() -> Trajectory:
            return await self.runner(self.client, task_id=prompt.task_id, sample=sample,
                                     seed=episode_seed(self.seed, prompt.index, sample))

        async with self._semaphore:
            trajectory = await rerun_on_death(self.watch, attempt)  # a cut attempt runs again (module doc)
        turns = tuple(replace(t, policy_versions=VersionSpan.of(version),  # no sync lands mid-rollout here
                              token_versions=((version, t.completion_len),) if t.completion_len else None)
                      for t in trajectory.turns)
        trajectory = replace(trajectory, turns=turns, rollout=RolloutMeta(prompt.index, version, probe=probe))
        self.on_trajectory(trajectory)
        return trajectory

    async def next_batch(self, n: int, learner_version: int) -> RolloutBatch:
        if n % self.group_size:
            raise ValueError(f"batch of {n} trajectories is not a multiple of group_size {self.group_size}")
        if learner_version != self.version:
            raise RuntimeError(f"sync rollout: engine holds version {self.version}, learner is at {learner_version}")
        before = await self._engine_version()
        prompts = self.tasks.take(n // self.group_size)
        t0 = time.monotonic()
        done = await asyncio.gather(*(self._episode(p, s, self.version) for p in prompts for s in range(self.group_size)))
        wall = time.monotonic() - t0
        after = await self._engine_version()
        if before != after or (after is not None and after != str(self.version)):
            raise RuntimeError(f"the engine's weight version changed during a sync rollout ({before!r} -> {after!r}, "
                               f"expected {self.version}); is another trainer using this engine?")
        ok = tuple(t for t in done if failure(t) is None)
        failed = tuple(t for t in done if failure(t) is not None)
        return RolloutBatch(ok, failed, tuple(prompts), rollout_metrics(done, ok, wall))

    async def _engine_version(self) -> str | None:
        if self.engine is None:
            return None
        engine = self.engine
        return await retry_on_death(self.watch, engine.weight_version)

    def state_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks.load_state_dict(state["tasks"])
        self.version = int(state["version"])


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
