"""The warm start's :class:`~sao.rl.rollout.sources.RolloutSource`: demonstrations played as they are needed.

    refs = tasks.take(n)                                   # the run's training stream: split=train only
    for each: trajectory = runner(ScriptedClient(demonstrator), task)   # the agent loop, the real tools and grading
    keep those the environment rewarded >= min_reward; play more until n are kept

Every demonstration is recorded (``on_trajectory``: ``trajectories.jsonl``), rejected ones too, which go in
the batch's ``failed`` (not trained on). The task stream is the one RL draws from, built with ``env.kwargs``
(``split: train`` for arithmetic), so no held-out problem (``env.heldout_kwargs``: ``split: test``) can be
demonstrated. Each step gets fresh demonstrations from the endless stream: the demonstrations trained on
are ``batch_size`` x steps.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from sao.agents import RolloutMeta, Trajectory
from sao.agents.loop.seeds import episode_seed
from sao.rl.errors import TrainError
from sao.rl.rollout.sources import RolloutBatch, rollout_metrics

_MAX_ROUNDS = 5  # rounds of plays per batch before a demonstrator that keeps failing stops the run


class DemonstrationSource:
    """Plays ``client`` (a :class:`~sao.agents.clients.ScriptedClient`) through ``runner`` (an
    :class:`~sao.agents.loop.episodes.EpisodeRunner`) on the prompts of ``tasks`` (module doc)."""

    def __init__(self, runner: Any, client: Any, tasks: Any, *, min_reward: float = 1.0, seed: int = 0,
                 concurrency: int = 8):
        self.runner, self.client, self.tasks = runner, client, tasks
        self.min_reward, self.seed = min_reward, seed
        self.concurrency = max(1, concurrency)
        self.on_trajectory = lambda trajectory: None

    async def _play(self, ref: Any, version: int, slots: asyncio.Semaphore) -> Trajectory:
        async with slots:
            t = await self.runner(self.client, task_id=ref.task_id, sample=0,
                                  seed=episode_seed(self.seed, ref.index, 0))
        t = replace(t, rollout=RolloutMeta(prompt_index=ref.index, policy_version=version))
        self.on_trajectory(t)
        return t

    async def next_batch(self, n: int, learner_version: int) -> RolloutBatch:
        t0 = time.monotonic()
        kept: list[Trajectory] = []
        played: list[Trajectory] = []
        slots = asyncio.Semaphore(self.concurrency)  # made here: a semaphore binds to the loop that first waits on it
        for _ in range(_MAX_ROUNDS):
            refs = self.tasks.take(n - len(kept))
            done = await asyncio.gather(*(self._play(r, learner_version, slots) for r in refs))
            played += done
            kept += [t for t in done if self.accepts(t)]
            if len(kept) >= n:
                break
        else:
            causes = sorted({t.error or f"reward {t.reward}" for t in played if not self.accepts(t)})[:3]
            raise TrainError(f"the demonstrator solved {len(kept)} of {len(played)} tasks in {_MAX_ROUNDS} rounds; "
                             f"first causes: {causes}. Its episodes are in trajectories.jsonl")
        rejected = tuple(t for t in played if not self.accepts(t))
        metrics = rollout_metrics(played, tuple(kept), time.monotonic() - t0)
        metrics |= {"demo/played": float(len(played)), "demo/rejected": float(len(rejected)),
                    "demo/tool_calls_mean": sum(t.num_tool_calls for t in kept) / len(kept)}
        return RolloutBatch(tuple(kept), rejected, metrics=metrics)

    def accepts(self, trajectory: Trajectory) -> bool:
        """Whether it is trained on: played to its end and rewarded at least ``min_reward``."""
        return trajectory.status == "ok" and trajectory.trainable and trajectory.reward >= self.min_reward

    def on_weights(self, version: int) -> None:
        pass  # demonstrations do not depend on the policy

    def state_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks.load_state_dict(state["tasks"])

