"""Who plays an evaluation's episodes, one :class:`Player` per run: the model through its client (the
token loop, or the text loop on a chat endpoint; several replicas through a router), the
environment's scripted agent (``--agent gold|empty``), an agent plug-in (``--agent NAME``, each
episode in its own subprocess: :class:`~sao.agents.external.runner.ExternalAgentRunner`, against the
session a :class:`~sao.agents.external.sessions.SessionOpener` opens per episode), or a given prediction
(``--grade-only``, read by :func:`~.swe_outputs.load_predictions`: jsonl, a JSON list, or preds.json's
object keyed by instance id).

An agent plug-in's episodes each get a session of the capture proxy in front of the endpoint
(:mod:`.capture`: exact tokens on a token endpoint, text on a chat one), unless the Player is given another
``session_opener`` (tests; :class:`~sao.agents.external.sessions.PassThroughSessions` points the agent at
the endpoint itself and captures nothing)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from sao.agents import (
    EpisodeRunner,
    LoopConfig,
    OpenAIChatClient,
    OpenAICompletionClient,
    Renderers,
    RetryPolicy,
    Trajectory,
    run_text_episode,
)
from sao.agents.clients import Endpoint
from sao.agents.engine import EngineWatch, routed, watching
from sao.agents.external.registry import find as find_plugin
from sao.agents.external.runner import ExternalAgentRunner
from sao.agents.external.sessions import SessionOpener
from sao.agents.loop import run_graded_patch, run_scripted_episode
from sao.agents.routing import RoutingClient
from sao.envs.capabilities import scripted_policies

from .capture import OpenerFor, capturing
from .errors import EvalError
from .swe_outputs import load_predictions

if TYPE_CHECKING:
    from .runner import EvalConfig


class Player:
    """Plays one episode of ``env_name`` with the agent ``cfg`` asks for, on ``endpoints`` (none: a
    scripted agent or ``--grade-only``). The model's clients are made here, the router's within
    :meth:`serving`, which closes them."""

    def __init__(self, cfg: EvalConfig, env_name: str, endpoints: list[Endpoint], env_kwargs: dict[str, Any],
                 session_opener: SessionOpener | None = None):
        self.cfg, self.env_name, self.endpoints = cfg, env_name, endpoints
        self.first = first = endpoints[0] if endpoints else None
        self.client: OpenAICompletionClient | OpenAIChatClient | None = None
        self.routing: RoutingClient | None = None  # several replicas
        self.runner: EpisodeRunner | None = None  # the token loop
        self.external: ExternalAgentRunner | None = None  # an agent plug-in
        self.sessions: SessionOpener | None = None  # its episodes' sessions
        self.opener_for: OpenerFor | None = None  # the capture proxy's, while serving
        self.tokenizer: Any = None
        self.loop_cfg: LoopConfig | None = None
        self.client_args: dict[str, Any] = {} if first is None else dict(
            api_key=first.api_key, timeout_s=cfg.timeout_s, retry=RetryPolicy(), max_connections=cfg.concurrency)
        if first is not None and cfg.plugin:
            self.external = ExternalAgentRunner(env_name, find_plugin(cfg.agent), timeout_s=cfg.agent_timeout(),
                                                step_limit=cfg.agent_steps, log_dir=cfg.output / "agents")
            self.sessions = session_opener  # None: each episode gets a session of the capture proxy (serving)
            if session_opener is None and first.mode != "chat":
                self.tokenizer = load_tokenizer(first)
                if len(endpoints) == 1:
                    self.client = OpenAICompletionClient(first.base_url, first.model, **self.client_args)
        elif first is not None:
            self.loop_cfg = LoopConfig(max_turns=cfg.max_turns, max_tokens=cfg.max_tokens,
                                       max_tokens_per_turn=cfg.max_tokens_per_turn,
                                       max_model_len=first.max_model_len, temperature=cfg.temperature)
            if first.mode == "chat":  # the text loop: no tokenizer
                self.client = OpenAIChatClient(first.base_url, first.model, **self.client_args)
            else:
                self.runner = EpisodeRunner(env_name, Renderers(load_tokenizer(first)), self.loop_cfg, env_kwargs)
                if len(endpoints) == 1:
                    self.client = OpenAICompletionClient(first.base_url, first.model, **self.client_args)
        self.predictions = load_predictions(cfg.grade_only) if cfg.grade_only is not None else None

    async def play(self, env: Any, task_id: str, sample: int, seed: int) -> Trajectory:
        env_name = self.env_name
        if self.predictions is not None:
            return await run_graded_patch(env, self.predictions[task_id], env_name=env_name, task_id=task_id)
        if self.external is not None:
            sessions = self.sessions
            if sessions is None:
                assert self.opener_for is not None, "the capture proxy runs within serving()"
                sessions = self.opener_for(self.routing.episode() if self.routing is not None else self.client)
            return await self.external.play(env, sessions, task_id=task_id, sample=sample, seed=seed)
        if self.first is None:
            policies = scripted_policies(env)
            if policies is None:  # plan() checked the benchmark's environment already
                raise EvalError(f"{env_name} has no scripted agents; use --agent llm")
            policy = policies(env.unwrapped, self.cfg.agent, task_id)
            return await run_scripted_episode(env, policy, env_name=env_name, task_id=task_id, sample=sample,
                                              seed=seed, max_turns=self.cfg.max_turns)
        if isinstance(self.client, OpenAIChatClient):
            return await run_text_episode(env, self.client, self.loop_cfg, env_name=env_name, task_id=task_id,
                                          sample=sample, seed=seed)
        assert self.runner is not None  # a token endpoint
        episode_client = self.routing.episode() if self.routing is not None else self.client
        return await self.runner.play(env, episode_client, task_id=task_id, sample=sample, seed=seed)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[EngineWatch | None]:
        """The engines kept up for the block: several replicas behind the router (each watched by it), or
        the watch of one local engine (None for an external one, or none); the clients closed at the end."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                watch = None
                if len(self.endpoints) > 1:
                    cfg = self.cfg
                    self.routing = await stack.enter_async_context(
                        routed(self.endpoints, cfg.router, max_restarts=cfg.max_restarts, **self.client_args))
                else:
                    watch = await stack.enter_async_context(
                        watching(self.first.server if self.first is not None else None, self.cfg.max_restarts))
                if self.external is not None and self.sessions is None:
                    self.opener_for = await stack.enter_async_context(
                        capturing(self.first, self.tokenizer, client_args=self.client_args,
                                  max_tokens=self.cfg.max_tokens_per_turn))
                yield watch
        finally:
            if self.client is not None:
                await self.client.aclose()

    def routing_summary(self) -> dict[str, Any]:
        """What the routing did (empty with one endpoint or none)."""
        return {"router": self.routing.router.name, **self.routing.stats.summary()} if self.routing is not None else {}


def load_tokenizer(endpoint: Endpoint) -> Any:
    """The tokenizer that tokens mode needs, or an :class:`EvalError` that says what to pass instead."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(endpoint.tokenizer)
    except Exception as exc:  # noqa: BLE001 - OSError, ValueError, ...: all mean "no tokenizer here"
        hint = "" if endpoint.managed else (
            "; for an endpoint that returns no token ids (hosted APIs), use --endpoint-mode chat (or auto)")
        raise EvalError(f"tokens mode needs the model's tokenizer, and {endpoint.tokenizer!r} cannot be loaded "
                        f"({type(exc).__name__}: {str(exc)[:300]}); pass --tokenizer DIR_OR_HF_ID{hint}") from exc
