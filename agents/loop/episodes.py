"""One episode of a registered environment, start to end: the one copy of that sequence.

    env = make(env_name, **env_kwargs)            # a fresh environment per episode
    renderer = renderer_for(env's tools)           # the chat template with those tools
    trajectory = await run_episode(env, client, renderer, loop, ...)
    env.close()                                   # whatever happened, in a thread (a container's removal blocks)

:class:`EpisodeRunner` holds what the episodes of one run share (the environment's name and
arguments, the renderers, the loop's limits) and plays one per call; training's rollout sources,
the held-out evaluation and ``sao-eval`` all play through it. :func:`opened` is its first and last
step, for callers that play an environment another way (scripted agents, the text loop).
:class:`Renderers` keeps one :class:`ChatRenderer` per tool set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from sao.envs import make

from ..chat import ChatRenderer, Tokenizer
from ..clients import CompletionClient
from ..records import Trajectory
from .env_calls import INFRASTRUCTURE, failure_of
from .skeleton import LoopConfig
from .token_loop import run_episode

RendererFor = Callable[[tuple[dict[str, Any], ...]], ChatRenderer]  # an environment's tools -> its renderer


class Renderers:
    """One :class:`ChatRenderer` per tool set, made on first use (a :data:`RendererFor`)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._made: dict[str, ChatRenderer] = {}

    def __call__(self, tools: tuple[dict[str, Any], ...]) -> ChatRenderer:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._made:
            self._made[key] = ChatRenderer(self.tokenizer, tools)
        return self._made[key]


def tools_of(env: gym.Env) -> tuple[dict[str, Any], ...]:
    """The tools an environment offers the model (none when it declares none)."""
    return tuple(getattr(env.unwrapped, "tools", ()))


@contextlib.asynccontextmanager
async def opened(env_name: str, env_kwargs: dict[str, Any]) -> AsyncIterator[gym.Env]:
    """A fresh environment for one episode, closed afterwards in a thread whatever happened."""
    env = make(env_name, **env_kwargs)
    try:
        yield env
    finally:
        await asyncio.to_thread(env.close)


@dataclass(frozen=True)
class EpisodeRunner:
    """Plays one token-loop episode of ``env_name`` per call (module doc)."""

    env_name: str
    renderer_for: RendererFor
    loop: LoopConfig
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    async def play(self, env: gym.Env, client: CompletionClient, *, task_id: str, sample: int = 0,
                   seed: int | None = None) -> Trajectory:
        """One episode on an environment the caller opened."""
        return await run_episode(env, client, self.renderer_for(tools_of(env)), self.loop, env_name=self.env_name,
                                 task_id=task_id, sample=sample, seed=seed)

    async def __call__(self, client: CompletionClient, *, task_id: str, sample: int = 0,
                       seed: int | None = None) -> Trajectory:
        started = time.monotonic()
        try:
            async with opened(self.env_name, self.env_kwargs) as env:
                return await self.play(env, client, task_id=task_id, sample=sample, seed=seed)
        except INFRASTRUCTURE as exc:  # the environment could not be made (no Docker daemon, say)
            return unplayed(self.env_name, task_id, sample, seed, exc, time.monotonic() - started)


def unplayed(env_name: str, task_id: str, sample: int, seed: int | None, exc: BaseException,
             wall_s: float) -> Trajectory:
    """The record of an episode whose environment could not even be made or closed (the Docker daemon
    is away, say): failed, an infrastructure error with its cause, so that the run goes on and a
    resumed evaluation plays it again."""
    error = f"{type(exc).__name__}: {exc}"
    return Trajectory(episode_id=uuid.uuid4().hex, env=env_name, task_id=task_id, sample=sample, seed=seed,
                      token_ids=(), action_mask=(), logprobs=(), turns=(), messages=(), reward=0.0,
                      terminated=False, truncated=False, status="failed", error=error,
                      info={"correct": False, "answer": None, "error": error, "exit_status": failure_of(exc)},
                      wall_s=wall_s,
                      failure=failure_of(exc))
