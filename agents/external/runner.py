"""One episode of an external agent: :class:`ExternalAgentRunner`, the same shape as
:class:`~sao.agents.loop.episodes.EpisodeRunner` (``play(env, ...) -> Trajectory`` on an environment
the caller opened), with a capture session in place of the model's client::

    brief = env's brief of the task (SWE: image, /testbed), or its reset     # no container of its own
    task  = AgentTask(prompt, messages, tools, image, sandbox rules with the episode's labels, limits)
    with open_session(episode_id) as session:                                # the capture proxy's session
        run = the agent in its own subprocess, under its timeout             # .process: group killed
        remove every container labelled with the episode                     # .containers, however it ended
        captured = session.assemble()
    verdict = the agent's failure, or the environment's grade of its answer/patch    # .verdicts
    Trajectory(captured tokens or a text record, reward, status, error, info)

Nothing raises out of :meth:`ExternalAgentRunner.play` for what the agent or the grading did: every
episode is a record (failed ones with their cause, :mod:`.verdicts`), and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from sao.envs.capabilities import TaskBrief, task_briefing

from ..loop.env_calls import call_env, failure_of, reset_env
from ..loop.episodes import tools_of
from ..records import Trajectory, jsonable
from .containers import episode_labels, remove_episode_containers
from .process import ChildRun, run_child
from .registry import AgentPlugin
from .sessions import AssembledLike, CaptureSessionLike, SessionOpener
from .task import AgentEndpoint, AgentResult, AgentTask, SandboxRules
from .verdicts import Verdict, agent_failure, graded
from .wire import Job


@dataclass(frozen=True)
class Captured:
    """What the episode's session captured: its calls, and the record's tokens (or a text record)."""

    n_calls: int
    fields: dict[str, Any]  # token_ids, action_mask, logprobs, turns, mode: the Trajectory's fields
    info: dict[str, Any]  # info["capture"]: calls, stats, segments


@dataclass(frozen=True)
class ExternalAgentRunner:
    """Plays episodes of ``env_name`` with the agent ``plugin`` (module doc).

    timeout_s:     the agent's wall time per episode (its subprocess and its process group are killed after).
    step_limit:    the most model calls the agent is asked to make (``AgentTask.step_limit``; None: its own).
    require_calls: an agent that never calls the model fails its episode (``no_calls``; training).
    sandbox:       the rules for containers the agent starts, where the environment states none (SWE does).
    log_dir:       where each episode's folder (``EPISODE_ID/``: job, result, ``agent.log``) is kept; None:
                   a temporary folder, removed after.
    """

    env_name: str
    plugin: AgentPlugin
    timeout_s: float = 3600.0
    step_limit: int | None = None
    require_calls: bool = False
    sandbox: SandboxRules = SandboxRules()
    log_dir: Path | None = None
    python: str = sys.executable

    async def play(self, env: gym.Env, open_session: SessionOpener, *, task_id: str, sample: int = 0,
                   seed: int | None = None) -> Trajectory:
        """One episode on an environment the caller opened; every ending is a record (module doc)."""
        started, episode_id = time.monotonic(), uuid.uuid4().hex
        try:
            brief = await brief_of(env, task_id, seed)
        except Exception as exc:  # noqa: BLE001 - the environment could not state its task: a recorded failure
            kind = failure_of(exc)
            verdict = Verdict.failed(kind, kind, f"{type(exc).__name__}: {exc}")
            return self._record(episode_id, task_id, sample, seed, (), verdict, None, {}, started)
        task = self.task_for(env, brief, episode_id, task_id, seed)
        async with entered(open_session(episode_id)) as session:
            run, removed = await self._run_agent(task, session)
            captured = captured_from(session)
        verdict = agent_failure(run, task.timeout_s, n_calls=captured.n_calls, require_calls=self.require_calls)
        if verdict is None:
            assert isinstance(run.outcome, AgentResult)
            verdict = await graded(env, task, run.outcome)
        agent_info = agent_facts(self.plugin, run, removed, verdict.status != "ok")
        return self._record(episode_id, task_id, sample, seed, brief.messages, verdict, captured,
                            {"agent": agent_info}, started)

    def task_for(self, env: gym.Env, brief: TaskBrief, episode_id: str, task_id: str, seed: int | None) -> AgentTask:
        """The agent's task from the environment's brief, its containers labelled with the episode."""
        labels = {**self.sandbox.labels, **episode_labels(episode_id)}
        limits = brief.limits
        sandbox = dataclasses.replace(self.sandbox, labels=labels) if limits is None else SandboxRules(
            network=limits.network, cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids, labels=labels)
        return AgentTask(env=self.env_name, task_id=task_id, episode_id=episode_id, prompt=prompt_of(brief.messages),
                         messages=brief.messages, tools=tools_of(env), image=brief.image, repo_path=brief.repo_path,
                         sandbox=sandbox, step_limit=self.step_limit, timeout_s=self.timeout_s,
                         extra=jsonable(brief.facts), seed=seed)

    async def _run_agent(self, task: AgentTask, session: CaptureSessionLike) -> tuple[ChildRun, list[str]]:
        """The agent's subprocess against the session; then every container of the episode removed."""
        job = Job(self.plugin.target, task, AgentEndpoint(session.base_url, session.model, session.api_key))
        try:
            with self._workdir(task.episode_id) as workdir:
                run = await run_child(job, workdir, timeout_s=task.timeout_s, python=self.python)
        finally:  # cancelled too: the process group is already killed (run_child), the containers go here
            removed = await asyncio.to_thread(remove_episode_containers, task.episode_id)
        return run, removed

    @contextlib.contextmanager
    def _workdir(self, episode_id: str) -> Iterator[Path]:
        if self.log_dir is None:
            with tempfile.TemporaryDirectory(prefix="sao-agent-") as tmp:
                yield Path(tmp)
            return
        path = self.log_dir / episode_id
        path.mkdir(parents=True, exist_ok=True)
        yield path

    def _record(self, episode_id: str, task_id: str, sample: int, seed: int | None, messages: tuple[Any, ...],
                verdict: Verdict, captured: Captured | None, extra: dict[str, Any], started: float) -> Trajectory:
        info = {**verdict.info, **(captured.info if captured else {}), **extra, "error": verdict.error,
                "exit_status": verdict.exit_status}
        fields = captured.fields if captured is not None else text_fields(())
        return Trajectory(episode_id=episode_id, env=self.env_name, task_id=task_id, sample=sample, seed=seed,
                          messages=tuple(messages), reward=verdict.reward, terminated=verdict.status == "ok",
                          truncated=False, status=verdict.status, error=verdict.error, info=jsonable(info),
                          wall_s=time.monotonic() - started, failure=verdict.failure, **fields)


async def brief_of(env: gym.Env, task_id: str, seed: int | None) -> TaskBrief:
    """The environment's brief of ``task_id`` (:class:`~sao.envs.capabilities.TaskBriefing`, in a thread:
    SWE resolves the image), or, for one that declares none, its ``reset``'s messages and info."""
    briefing = task_briefing(env)
    if briefing is not None:
        return await asyncio.to_thread(call_env, "env.brief", briefing, env.unwrapped, task_id)
    obs, info = await reset_env(env, seed=seed, options={"task_id": task_id})
    return TaskBrief(tuple(obs), facts=jsonable(info))


def prompt_of(messages: tuple[Any, ...]) -> str:
    """The task's text: the first user message's content."""
    content = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    return content if isinstance(content, str) else str(content or "")


@contextlib.asynccontextmanager
async def entered(manager: Any) -> AsyncIterator[CaptureSessionLike]:
    """A session opener's context manager entered, async or plain (:class:`~.sessions.SessionOpener`)."""
    if hasattr(manager, "__aenter__"):
        async with manager as session:
            yield session
    else:
        with manager as session:
            yield session


def captured_from(session: CaptureSessionLike) -> Captured:
    """The session's calls as the record's fields: the assembled tokens (trainable), or a text record when it
    captured text calls or none (a pass-through session)."""
    n_calls = session.n_calls
    assembled = session.assemble()
    if assembled is None:
        return Captured(n_calls, text_fields(()), {"capture": {"calls": n_calls}})
    segments = [dataclasses.asdict(s) if dataclasses.is_dataclass(s) else s for s in assembled.segments]
    info = {"capture": {"calls": n_calls, "stats": assembled.stats.as_json(), "segments": segments}}
    return Captured(n_calls, token_fields(assembled) if assembled.token_ids else text_fields(assembled.turns), info)


def token_fields(assembled: AssembledLike) -> dict[str, Any]:
    return {"token_ids": tuple(assembled.token_ids), "action_mask": tuple(assembled.action_mask),
            "logprobs": tuple(assembled.logprobs), "turns": tuple(assembled.turns), "mode": "tokens",
            "segments": tuple(assembled.segments)}


def text_fields(turns: Any) -> dict[str, Any]:
    return {"token_ids": (), "action_mask": (), "logprobs": (), "turns": tuple(turns), "mode": "text"}


def agent_facts(plugin: AgentPlugin, run: ChildRun, removed: list[str], failed: bool) -> dict[str, Any]:
    """``info["agent"]``: who played, how its process ended, what it reported, the containers it left."""
    facts: dict[str, Any] = {"name": plugin.name, "target": plugin.target, "wall_s": round(run.wall_s, 3),
                             "returncode": run.returncode, "timed_out": run.timed_out,
                             "containers_removed": removed}
    if isinstance(run.outcome, AgentResult):
        facts |= {"steps": run.outcome.steps, "info": run.outcome.info}
    if failed:
        facts["log_tail"] = run.log_tail
    return facts
