"""agents/external/runner.py with fakes: an agent plug-in's episode on arithmetic, graded by the environment's
own checker (math's PredictionGrader: right, wrong, none), each failure a recorded failed episode with its
cause (agent_error, agent_timeout, no_calls, grading failed), and the capture session's tokens on the record."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sao.agents.capture import CaptureStats
from sao.agents.external.registry import AgentPlugin
from sao.agents.external.runner import ExternalAgentRunner
from sao.agents.external.sessions import PassThroughSessions
from sao.agents.external.task import AgentEndpoint
from sao.agents.loop import opened
from sao.agents.records import Trajectory, TurnRecord
from sao.envs import make
from sao.envs.math_envs import MathEnv, grade_answer
from tests.agent_plugins import FAKE

TASK = "add-d2-s0-i3"  # arithmetic's task ids rebuild their task (sao.envs.arithmetic)
SESSIONS = PassThroughSessions(AgentEndpoint("http://127.0.0.1:9/v1", "fake"))


def play(agent: str, tmp_path: Path, sessions: Any = SESSIONS, env_name: str = "arithmetic",
         **runner: Any) -> Trajectory:
    plugin = AgentPlugin(agent, f"{FAKE}:{agent}")
    external = ExternalAgentRunner(env_name, plugin, log_dir=tmp_path, **{"timeout_s": 60.0, **runner})

    async def go() -> Trajectory:
        async with opened(env_name, {}) as env:
            return await external.play(env, sessions, task_id=TASK, sample=1, seed=5)

    return asyncio.run(go())


@pytest.mark.parametrize(("given", "correct", "answer"), [
    ("\\boxed{7}", True, "7"), ("The answer is 7.", True, "7"), (" 7 ", True, "7"),
    ("8", False, "8"), ("", False, None), (None, False, None)])
def test_math_grades_a_given_answer_with_its_own_checker(given: Any, correct: bool, answer: Any):
    env = make("arithmetic").unwrapped
    task_id = next(t for t in env.task_ids(50) if env.tasks.get(t).answer == "7")
    info = grade_answer(env, task_id, given)
    assert info["correct"] is correct and info["answer"] == answer and info["error"] is None
    assert info["gold"] == "7" and info["exit_status"] == "grade_only"


def test_a_bare_expression_is_the_answer_itself_where_answers_are_not_integers():
    env = MathEnv(_Tasks(), integer_answers=False)
    assert grade_answer(env, "q", "x + 1")["correct"] and not grade_answer(env, "q", "x + 2")["correct"]


class _Tasks:
    def get(self, task_id: str) -> Any:
        from sao.envs.math_envs import MathTask

        return MathTask("q", "What is x plus one?", "x + 1")


@pytest.mark.parametrize(("agent", "reward"), [("gold", 1.0), ("gold_async", 1.0), ("wrong", 0.0), ("silent", 0.0)])
def test_an_agents_answer_is_graded_by_the_environment(agent: str, reward: float, tmp_path: Path):
    t = play(agent, tmp_path)
    assert t.status == "ok" and t.reward == reward and t.correct is (reward == 1.0) and t.failure is None
    assert t.info["exit_status"] == "agent_returned" and t.info["agent"]["name"] == agent
    assert t.task_id == TASK and t.sample == 1 and t.seed == 5 and t.terminated
    # a pass-through session captured nothing: a text record, still written
    assert t.mode == "text" and t.token_ids == () and t.info["capture"] == {"calls": 0}
    assert t.messages[-1]["role"] == "user" and "What is" in t.messages[-1]["content"]
    assert (tmp_path / t.episode_id / "agent.log").is_file()


def test_an_agent_that_raises_is_a_failed_episode_with_its_message(tmp_path: Path):
    t = play("crash", tmp_path)
    assert t.status == "failed" and t.failure == "agent_error" and t.agent_error and t.reward == 0.0
    assert t.error == f"agent_error: the agent raised RuntimeError: the agent broke on {TASK}"
    assert t.info["exit_status"] == "agent_error" and "in crash" in t.info["traceback"]


def test_an_agent_past_its_timeout_is_a_failed_episode(tmp_path: Path):
    t = play("hang", tmp_path, timeout_s=2.0)
    assert t.status == "failed" and t.failure == "agent_error" and t.info["exit_status"] == "agent_timeout"
    assert t.error == "agent_timeout: the agent ran past its 2 s timeout and was killed"
    assert t.info["agent"]["timed_out"] and not t.correct


def test_in_training_an_agent_that_never_called_the_model_fails_with_no_calls(tmp_path: Path):
    t = play("gold", tmp_path, require_calls=True)
    assert t.status == "failed" and t.info["exit_status"] == "no_calls" and t.error.startswith("no_calls:")


@dataclass(frozen=True)
class _Assembled:
    token_ids: tuple[int, ...] = (1, 2, 3, 4)
    action_mask: tuple[int, ...] = (0, 0, 1, 1)
    logprobs: tuple[float, ...] = (0.0, 0.0, -0.5, -0.25)
    turns: tuple[TurnRecord, ...] = (TurnRecord(2, 2, "stop", None, 0.0, 0.1),)
    segments: tuple[Any, ...] = ()
    stats: CaptureStats = field(default_factory=lambda: CaptureStats(calls=1))


@dataclass
class _Session:
    base_url: str = "http://127.0.0.1:9/sessions/x/v1"
    model: str = "fake"
    api_key: str = "EMPTY"
    n_calls: int = 1
    opened_for: list[str] = field(default_factory=list)

    def assemble(self) -> _Assembled:
        return _Assembled()


def test_a_capture_sessions_tokens_make_a_trainable_record(tmp_path: Path):
    session = _Session()

    @contextlib.asynccontextmanager
    async def sessions(episode_id: str):  # type: ignore[no-untyped-def]
        session.opened_for.append(episode_id)
        yield session

    t = play("gold", tmp_path, sessions=sessions, require_calls=True)
    assert t.status == "ok" and t.reward == 1.0 and t.mode == "tokens" and t.trainable
    assert t.token_ids == (1, 2, 3, 4) and t.action_mask == (0, 0, 1, 1) and t.logprobs == (0.0, 0.0, -0.5, -0.25)
    assert session.opened_for == [t.episode_id] and len(t.turns) == 1
    assert t.info["capture"] == {"calls": 1, "segments": [], "stats": {
        "calls": 1, "merged": 0, "split": 0, "split_reasons": {}, "pinned_calls": 0, "failed_calls": 0}}


class _UngradableMath(MathEnv):
    @staticmethod
    def prediction_grader(env: Any, task_id: str, answer: str) -> dict[str, Any]:
        return {"correct": False, "answer": answer, "error": "the grading container did not start"}


def test_a_grading_that_cannot_run_is_a_failed_episode_not_a_zero(tmp_path: Path):
    from sao.envs.arithmetic import ArithmeticTasks

    plugin = AgentPlugin("gold", f"{FAKE}:gold")
    external = ExternalAgentRunner("arithmetic", plugin, timeout_s=60.0, log_dir=tmp_path)
    env = _UngradableMath(ArithmeticTasks(), integer_answers=True)
    t = asyncio.run(external.play(env, SESSIONS, task_id=TASK))
    assert t.status == "failed" and t.failure == "infra_error" and t.info["exit_status"] == "infra_error"
    assert t.error == "grading failed: the grading container did not start"
