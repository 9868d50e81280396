"""sao-train with an agent plug-in (``agent=NAME``): the run's capture proxy, and the episode players of its
rollouts and of its held-out evaluation (:class:`~sao.agents.external.training.CapturedAgentEpisodes`), which
take the place of the project's own loop (:class:`~sao.agents.loop.episodes.EpisodeRunner`).

Every call of the agent is rendered with the run's chat template and tokenizer and sampled through the
rollout driver's per-episode client, at the run's temperature with top_p 1, top_k -1 and no penalties
(pinned, whatever the agent asks); one call's answer is bounded by ``env.max_tokens_per_turn`` (else
``env.max_tokens``, else what the engine's context leaves after the prompt). Each episode's job, result and agent log are kept under ``RUN/agents/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.agents.capture import CaptureProxy, PinnedSampling, default_tool_parser
from sao.agents.capture.tool_calls import ToolCallParser
from sao.agents.external.registry import find
from sao.agents.external.runner import ExternalAgentRunner
from sao.agents.external.training import CapturedAgentEpisodes
from sao.agents.loop.episodes import RendererFor
from sao.rl.config import TrainConfig


@dataclass(frozen=True)
class AgentPlayers:
    """Makes the agent plug-in's episode players of one run (module doc)."""

    cfg: TrainConfig
    proxy: CaptureProxy
    renderer_for: RendererFor
    tool_parser: ToolCallParser
    model: str
    log_dir: Path

    def episodes(self, env_name: str, *, temperature: float, env_kwargs: dict[str, Any]) -> CapturedAgentEpisodes:
        cfg = self.cfg
        runner = ExternalAgentRunner(env_name, find(cfg.agent), timeout_s=cfg.agent_run.timeout_s,
                                     step_limit=cfg.agent_run.steps, require_calls=True, log_dir=self.log_dir)
        rule = PinnedSampling(temperature=temperature, max_tokens=cfg.env.max_tokens_per_turn or cfg.env.max_tokens)
        return CapturedAgentEpisodes(runner, self.proxy, self.renderer_for, self.tool_parser, self.model, rule,
                                     env_kwargs, max_model_len=cfg.engine.max_model_len)


@contextlib.asynccontextmanager
async def agent_players(cfg: TrainConfig, tokenizer: Any, renderer_for: RendererFor, model: str,
                        run_dir: Path) -> AsyncIterator[AgentPlayers | None]:
    """The run's :class:`AgentPlayers` with its proxy running for the block; None with ``agent=llm``."""
    if cfg.agent == "llm":
        yield None
        return
    async with CaptureProxy() as proxy:
        yield AgentPlayers(cfg, proxy, renderer_for, default_tool_parser(tokenizer), model, Path(run_dir) / "agents")
