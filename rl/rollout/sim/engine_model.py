"""The simulator's models of a trajectory's cost and of one engine replica.

:func:`sample_trajectory` draws a trajectory's turns from the workload config with a random
stream keyed by ``(seed, group, sample, attempt)``: every mode sees the same trajectory for the same
request and attempt, whatever order it runs them in (the comparison is fair by construction).

:class:`SimEngine` is continuous batching as processor sharing (see :mod:`simconfig`): every
decoding sequence advances at ``r(b)`` while ``b`` sequences decode. It keeps a "virtual service"
clock ``S`` (tokens each sequence has received since the engine started); a sequence that needs
``w`` more tokens finishes when ``S`` grows by ``w``, so one heap ordered by finishing ``S`` gives
the next completion in O(log b) however ``b`` changes.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from sao.rl.rollout.schedulers import Prompt
from sao.rl.rollout.sim.config import EngineConfig, WorkloadConfig


@dataclass(frozen=True)
class Turn:
    """One turn: ``work`` decode-token equivalents (prefill + response) on the engine, then
    ``env_s`` seconds in the environment (0 after the last turn)."""

    prefill_tokens: int
    response_tokens: int
    work: float
    env_s: float
    observation_tokens: int


@dataclass(frozen=True)
class TrajectorySpec:
    """What a trajectory will cost. ``fails_at``: the turn after which the episode breaks, or None."""

    turns: tuple[Turn, ...]
    fails_at: int | None

    @property
    def action_tokens(self) -> int:
        return sum(t.response_tokens for t in self.turns)

    @property
    def total_tokens(self) -> int:
        """Every token of the finished sequence (what the trainer processes)."""
        return sum(t.prefill_tokens + t.response_tokens for t in self.turns)


def sample_trajectory(workload: WorkloadConfig, engine: EngineConfig, prompt: Prompt, seed: int) -> TrajectorySpec:
    rng = random.Random(f"{seed}:{prompt.group_id}:{prompt.index}:{prompt.attempt}")
    n = max(1, int(round(workload.turns.sample(rng))))
    turns = []
    context = int(round(workload.prompt_tokens.sample(rng)))
    for i in range(n):
        response = max(1, int(round(workload.response_tokens.sample(rng))))
        last = i == n - 1
        obs = 0 if last else int(round(workload.observation_tokens.sample(rng)))
        env = 0.0 if last else workload.env_latency_s.sample(rng)
        turns.append(Turn(context, response, context * engine.prefill_cost + response, env, obs))
        context = obs
    fails_at = rng.randrange(n) if rng.random() < workload.episode_failure_prob else None
    return TrajectorySpec(tuple(turns), fails_at)


class SimEngine:
    """One replica: processor-sharing decode, pause for syncs, death (see the module docstring)."""

    def __init__(self, rid: int, config: EngineConfig) -> None:
        self.rid = rid
        self.config = config
        self.version = 0
        self.alive = True
        self.paused = False
        self.sync_token = 0  # the latest sync; an older sync's completion is ignored
        self.epoch = 0  # bumps whenever the next completion time may have changed
        self._S = 0.0
        self._t = 0.0
        self._heap: list[tuple[float, int]] = []  # (S at which the sequence finishes, traj id)
        self.busy_s = 0.0  # time with at least one sequence decoding and not paused
        self.work_done = 0.0  # decode-token equivalents served

    @property
    def decoding(self) -> int:
        return len(self._heap)

    @property
    def busy(self) -> bool:
        return bool(self._heap) and not self.paused and self.alive

    def advance(self, now: float) -> None:
        dt = now - self._t
        if dt > 0 and self.busy:
            b = len(self._heap)
            r = self.config.per_sequence_tps(b)
            self._S += r * dt
            self.busy_s += dt
            self.work_done += r * b * dt
        self._t = now

    def add(self, traj_id: int, work: float, now: float) -> None:
        self.advance(now)
        heapq.heappush(self._heap, (self._S + work, traj_id))
        self.epoch += 1

    def next_completion(self) -> float | None:
        if not self.busy:
            return None
        r = self.config.per_sequence_tps(len(self._heap))
        return self._t + max(self._heap[0][0] - self._S, 0.0) / r

    def pop_finished(self, now: float) -> list[int]:
        """The sequences whose turn is done by ``now``."""
        self.advance(now)
        out = []
        while self._heap and self._heap[0][0] <= self._S + 1e-6:
            out.append(heapq.heappop(self._heap)[1])
        if out:
            self.epoch += 1
        return out

    def remove(self, traj_id: int, now: float) -> None:
        """Stop decoding ``traj_id`` (its trajectory is gone)."""
        self.advance(now)
        self._heap = [(s, t) for s, t in self._heap if t != traj_id]
        heapq.heapify(self._heap)
        self.epoch += 1

    def cancel(self, traj_id: int, now: float) -> float:
        """Stop decoding ``traj_id`` (it moves elsewhere); returns the work its turn had left."""
        self.advance(now)
        left = next((s - self._S for s, t in self._heap if t == traj_id), None)
        if left is None:
            raise ValueError(f"engine {self.rid} is not decoding trajectory {traj_id}")
        self.remove(traj_id, now)
        return max(left, 0.0)

    def decoding_ids(self) -> list[int]:
        return [tid for _, tid in self._heap]

    def pause(self, now: float) -> None:
        self.advance(now)
        self.paused = True
        self.epoch += 1

    def resume(self, now: float, version: int) -> None:
        self.advance(now)
        self.paused, self.version = False, version
        self.epoch += 1

    def kill(self, now: float) -> list[int]:
        """Die; returns the ids that were decoding."""
        self.advance(now)
        lost = self.decoding_ids()
        self._heap.clear()
        self.alive, self.paused, self.version = False, False, -1
        self.sync_token += 1
        self.epoch += 1
        return lost

    def restart(self, now: float) -> None:
        self.advance(now)
        self.alive = True
        self.epoch += 1
