"""An external agent's episodes as a training run plays them: :class:`CapturedAgentEpisodes`, a callable of
the same shape as :class:`~sao.agents.loop.episodes.EpisodeRunner` (``await episodes(client, task_id=...,
sample=..., seed=...) -> Trajectory``), so that every rollout mode and the held-out evaluation play an agent
plug-in where they would play the project's own loop.

Each episode opens the environment, then a session of the run's :class:`~sao.agents.capture.CaptureProxy`
whose calls are rendered with the run's chat template and sampled through ``client``: the rollout driver's
per-episode client, so the tokens carry the engine's log-probs and per-token versions as the built-in loop's
do. The run's sampling settings are pinned (:class:`~sao.agents.capture.PinnedSampling`: its temperature,
top_p 1, top_k -1, no penalties), whatever the agent asks, and each call records what it overrode. An agent
that never calls the model fails its episode (``no_calls``): a trajectory with no tokens cannot be trained.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..capture import CaptureProxy, CaptureSessions, PinnedSampling, TokenUpstream
from ..capture.tool_calls import ToolCallParser
from ..clients import CompletionClient
from ..loop.env_calls import INFRASTRUCTURE
from ..loop.episodes import RendererFor, opened, unplayed
from ..records import Trajectory
from .runner import ExternalAgentRunner


@dataclass(frozen=True)
class CapturedAgentEpisodes:
    """Plays one episode of ``runner``'s agent per call through ``proxy`` (module doc); ``model`` is the name
    the agent is told to ask for, ``rule`` the run's sampling."""

    runner: ExternalAgentRunner
    proxy: CaptureProxy
    renderer_for: RendererFor
    tool_parser: ToolCallParser
    model: str
    rule: PinnedSampling
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None  # the engine's context: a call's answer may use what its prompt leaves

    async def __call__(self, client: CompletionClient, *, task_id: str, sample: int = 0,
                       seed: int | None = None) -> Trajectory:
        started = time.monotonic()
        upstream = TokenUpstream(client, self.renderer_for, self.tool_parser, self.model, max_model_len=self.max_model_len)
        sessions = CaptureSessions(self.proxy, upstream, self.rule)
        try:
            async with opened(self.runner.env_name, self.env_kwargs) as env:
                return await self.runner.play(env, sessions, task_id=task_id, sample=sample, seed=seed)
        except INFRASTRUCTURE as exc:  # the environment could not be made (no Docker daemon, say)
            return unplayed(self.runner.env_name, task_id, sample, seed, exc, time.monotonic() - started)
