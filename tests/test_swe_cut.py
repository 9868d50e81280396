"""Episodes cut by a limit of the agent loop (turns, tokens, context): finished by an environment that
offers CutGrading (SWE: the diff graded, or an empty patch with autosubmit off), every episode's
``exit_status``, and the summary's counts and warning. The SWE environment runs on a scripted sandbox
here (no Docker); the last test runs ``sao-eval swe-local`` against Docker."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import sao.envs as E
from sao.agents import ByteTokenizer, ChatRenderer, LoopConfig, OpenAIChatClient, OpenAICompletionClient, RetryPolicy
from sao.agents import run_episode, run_text_episode
from sao.agents.errors import ContextOverflowError
from sao.agents.loop import run_scripted_episode
from sao.agents.loop.exits import EXIT_STATUSES, LIMITS, LOOP_LIMITS, exit_status
from sao.agents.loop.skeleton import Reply, Sampled, run_turns
from sao.agents.records import Trajectory, TurnRecord
from sao.agents.store import read_trajectories
from sao.agents.testing.fake_server import FakeServer
from sao.agents.testing.fake_server import Reply as ServerReply
from sao.envs.capabilities import cut_grading
from sao.envs.core import TextEnv
from sao.envs.swe_policies import scripted_policy
from sao.envs.swebench import SWEBenchEnv, SWEInstance, instance_report
from sao.envs.swebench import env as swe_env_module
from sao.envs.swebench.grading import GradeResult
from sao.envs.swebench.images import ResolvedImage
from sao.evals.runner import EvalConfig, cut_warning, evaluate, exits_summary
from sao.evals.swe_outputs import Outcome
from sao.sandboxes import ExecResult, FakeSandbox, SandboxError

FAST = RetryPolicy(max_retries=2, backoff_s=0.01, max_backoff_s=0.02)
FIX = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
INSTANCE = SWEInstance(instance_id="demo__m-1", repo="demo/m", base_commit="b" * 40, problem_statement="x is 1",
                       patch=FIX, test_patch="", fail_to_pass=("t",), pass_to_pass=(), version="1",
                       environment_setup_commit="b" * 40)
EDIT = {"name": "bash", "arguments": {"command": "sed -i s/1/2/ m.py"}}


# -- a SWE environment on a scripted sandbox ----------------------------------------------------------


class RepoSandbox(FakeSandbox):
    """The agent's container: a bash command that runs ``sed`` makes the fix; the diff is the fix once made."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(self.answer)
        self.fixed = False

    def answer(self, command: str) -> ExecResult | str:
        if command.endswith("/tmp/.sao-agent.diff"):  # workspace.take_diff
            diff = FIX if self.fixed else ""
            self.write_file("/tmp/.sao-agent.diff", diff)
            return f"{len(diff.encode())}\n"
        self.fixed = self.fixed or "sed -i" in command
        return "ok\n"


def fake_grade(env: SWEBenchEnv, inst: SWEInstance, patch: bytes, image: str) -> GradeResult:
    resolved = patch.decode() == inst.patch
    report = instance_report(inst.instance_id, "resolved" if resolved else "unresolved", patch_exists=True,
                             applied_with="git apply", resolved=resolved)
    return GradeResult(resolved, report, duration_s=0.01)


@pytest.fixture
def swe(monkeypatch):
    """``swe(**kwargs)``: a SWEBenchEnv whose containers are :class:`RepoSandbox` es and whose grading
    resolves exactly the instance's patch."""
    monkeypatch.setattr(swe_env_module, "DockerSandbox", RepoSandbox)
    monkeypatch.setattr(swe_env_module, "prepare_workspace", lambda sb, base, hide_history: base)
    monkeypatch.setattr(SWEBenchEnv, "grade_diff", fake_grade)
    monkeypatch.setattr(SWEBenchEnv, "resolve_image", lambda self, inst: ResolvedImage("img:1", "images-arg"))

    def make(**kwargs: Any) -> SWEBenchEnv:
        return SWEBenchEnv([INSTANCE], name="fake-swe", docker_client=object(), **kwargs)

    return make


class Sampler:
    """A turn sampler with no tokens: ``script`` items are replies (text) or exceptions to raise."""

    def __init__(self, script: Sequence[str | BaseException], *, spent: int = 10):
        self.script, self.spent = list(script), spent

    def observe(self, obs: list[dict]) -> None:
        pass

    def context_left(self) -> None:
        return None

    async def sample(self, messages, params, clock) -> Reply:
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return Reply(item, "stop", self.spent, TurnRecord(0, 0, "stop", None, clock(), clock()))

    def sampled(self) -> Sampled:
        return Sampled()


def call_text(call: dict) -> str:
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def play(env: Any, script: Sequence[str | BaseException], cfg: LoopConfig) -> Trajectory:
    try:
        return asyncio.run(run_turns(env, Sampler(script), cfg, env_name="fake-swe", task_id=INSTANCE.instance_id,
                                     seed=1))
    finally:
        env.close()


LS = call_text({"name": "bash", "arguments": {"command": "ls"}})
CUTS = [  # (loop config, the sampler's script, the limit that cuts it)
    (LoopConfig(max_turns=3, max_tokens=1000), [call_text(EDIT), LS, LS], "max_turns"),
    (LoopConfig(max_turns=9, max_tokens=20), [call_text(EDIT), LS, LS], "max_tokens"),  # 10 + 10: none left
    (LoopConfig(max_turns=9, max_tokens=1000), [call_text(EDIT), ContextOverflowError("prompt too long")], "context"),
]


@pytest.mark.parametrize(("cfg", "script", "limit"), CUTS, ids=[c[2] for c in CUTS])
def test_a_loop_cut_swe_episode_is_graded_through_cut_grading(swe, cfg, script, limit):
    env = swe()
    assert cut_grading(env) is not None
    t = play(env, script, cfg)
    assert t.status == "ok" and t.reward == 1.0 and t.correct
    assert t.terminated and t.truncated  # graded: the reward is final, not bootstrapped; a limit cut it
    assert t.info["exit_status"] == t.info["truncated_by"] == limit
    assert t.info["patch"] == FIX and t.info["report"]["status"] == "resolved" and t.info["error"] is None
    assert "unsubmitted_patch" not in t.info


def test_without_autosubmit_a_loop_cut_episode_scores_an_empty_patch(swe):
    t = play(swe(autosubmit=False), [call_text(EDIT), LS], LoopConfig(max_turns=2))
    assert t.status == "ok" and t.reward == 0.0 and not t.correct and t.terminated and t.truncated
    assert (t.info["exit_status"], t.info["patch"], t.info["answer"]) == ("max_turns", "", None)
    assert t.info["report"]["status"] == "empty_patch" and t.info["error"] is None
    assert t.info["unsubmitted_patch"] == FIX  # kept for reading, never graded nor predicted
    assert Outcome.of(t).kind == "empty_patch" and Outcome.of(t).patch == ""


def test_without_autosubmit_the_env_step_limit_scores_an_empty_patch_and_a_submit_is_graded(swe):
    submit = call_text({"name": "submit", "arguments": {}})
    cut = play(swe(autosubmit=False, max_steps=2), [call_text(EDIT), LS], LoopConfig(max_turns=5))
    assert (cut.info["exit_status"], cut.reward, cut.info["patch"]) == ("max_steps", 0.0, "")
    assert cut.terminated and cut.truncated and "truncated_by" not in cut.info
    done = play(swe(autosubmit=False), [call_text(EDIT), submit], LoopConfig(max_turns=5))
    assert (done.info["exit_status"], done.reward, done.info["patch"]) == ("submitted", 1.0, FIX)
    assert done.terminated and not done.truncated


def test_the_env_step_limit_is_graded_final(swe):
    t = play(swe(max_steps=2), [call_text(EDIT), LS], LoopConfig(max_turns=5))
    assert (t.info["exit_status"], t.reward, t.info["patch"]) == ("max_steps", 1.0, FIX)
    assert t.terminated and t.truncated  # the learner does not bootstrap a graded diff


def test_the_token_loop_finishes_a_cut_episode(swe):
    env = swe()

    async def go() -> Trajectory:
        client = OpenAICompletionClient(server.base_url, "fake", timeout_s=5.0, retry=FAST)
        try:
            return await run_episode(env, client, ChatRenderer(ByteTokenizer(), env.tools),
                                     LoopConfig(max_turns=2, max_tokens=10_000, max_model_len=100_000),
                                     env_name="fake-swe", task_id=INSTANCE.instance_id, seed=3)
        finally:
            await client.aclose()
            env.close()

    with FakeServer([ServerReply(text=call_text(EDIT)), ServerReply(text=LS)]) as server:
        t = asyncio.run(go())
    assert t.mode == "tokens" and len(t.turns) == 2 and t.status == "ok"
    assert (t.reward, t.terminated, t.truncated, t.info["exit_status"]) == (1.0, True, True, "max_turns")
    from sao.rl.learner.batch import collate  # the learner: a graded cut is not bootstrapped, an unfinished one is

    batch = collate([t, dataclasses.replace(t, terminated=False, reward=0.0)], pad_id=0)
    assert batch.truncated.tolist() == [False, True] and batch.rewards.tolist() == [1.0, 0.0]


def test_the_text_loop_finishes_a_cut_episode(swe):
    env = swe()
    edit = {"id": "toolu_1", "type": "function", "function": {"name": "bash", "arguments": json.dumps(EDIT["arguments"])}}
    ls = {"id": "toolu_2", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}

    async def go() -> Trajectory:
        client = OpenAIChatClient(server.base_url, "fake", timeout_s=5.0, retry=FAST)
        try:
            return await run_text_episode(env, client, LoopConfig(max_turns=2, max_tokens=10_000),
                                          env_name="fake-swe", task_id=INSTANCE.instance_id, seed=3)
        finally:
            await client.aclose()
            env.close()

    with FakeServer([ServerReply(tool_calls=(edit,)), ServerReply(tool_calls=(ls,))], chat_only=True) as server:
        t = asyncio.run(go())
    assert t.mode == "text" and t.status == "ok"
    assert (t.reward, t.terminated, t.truncated, t.info["exit_status"]) == (1.0, True, True, "max_turns")


def test_the_scripted_loop_finishes_a_cut_episode(swe):
    env = swe()
    policy = scripted_policy([("bash", EDIT["arguments"]), ("bash", {"command": "ls"})])  # submits third
    try:
        t = asyncio.run(run_scripted_episode(env, policy, env_name="fake-swe", task_id=INSTANCE.instance_id,
                                             max_turns=2))
    finally:
        env.close()
    assert (t.reward, t.terminated, t.truncated) == (1.0, True, True)
    assert t.info["exit_status"] == t.info["truncated_by"] == "max_turns" and t.info["patch"] == FIX


# -- environments without CutGrading, and a finish_cut that fails -------------------------------------


class Endless(TextEnv):
    """Never ends an episode by itself."""

    def task_ids(self, limit: int | None = None) -> list[str]:
        return ["t"]

    def _begin(self, task_id: str | None) -> tuple[list[dict], dict]:
        return [{"role": "user", "content": "go on"}], {}

    def _respond(self, action: dict) -> tuple[list[dict], float, bool, bool, dict]:
        return [{"role": "user", "content": "more"}], 0.0, False, False, {}


def cut_with(finish: Any) -> Trajectory:
    env = type("CutEnv", (Endless,), {"finish_cut": finish})()
    return asyncio.run(run_turns(env, Sampler(["a", "b"]), LoopConfig(max_turns=2), env_name="e", task_id="t"))


def test_an_env_without_cut_grading_stays_unfinished_as_before():
    env = Endless()
    assert cut_grading(env) is None
    t = asyncio.run(run_turns(env, Sampler(["a", "b"]), LoopConfig(max_turns=2), env_name="e", task_id="t"))
    assert t.status == "ok" and t.truncated and not t.terminated and t.reward == 0.0
    assert t.info["exit_status"] == t.info["truncated_by"] == "max_turns" and t.info["correct"] is False
    arithmetic = E.make("arithmetic")
    assert cut_grading(arithmetic) is None


def test_what_finish_cut_returns_is_recorded():
    t = cut_with(lambda self, reason: (0.5, {"correct": False, "answer": "a", "error": None, "seen": reason}))
    assert (t.reward, t.terminated, t.truncated, t.info["seen"]) == (0.5, True, True, "max_turns")
    assert t.info["exit_status"] == "max_turns"


@pytest.mark.parametrize(("finish", "failure", "message"), [
    (lambda self, reason: 1 / 0, "env_error", "env.finish_cut raised ZeroDivisionError"),
    (lambda self, reason: 1.0, "env_error", "must return (reward, info)"),
    (lambda self, reason: ("1", {}), "env_error", "reward must be a real number"),
    (lambda self, reason: (1.0, {"correct": True}), "env_error", "info must be a dict with"),
    (lambda self, reason: (_ for _ in ()).throw(SandboxError("container gone")), "infra_error", "container gone"),
])
def test_a_failing_finish_cut_is_a_recorded_failure_not_a_crash(finish, failure, message):
    t = cut_with(finish)
    assert t.status == "failed" and t.failure == failure and message in t.error
    assert t.info["exit_status"] == failure and t.info["truncated_by"] == "max_turns"
    assert not t.terminated and t.truncated and t.reward == 0.0 and len(t.turns) == 2


# -- the vocabulary, the summary and the warning --------------------------------------------------------


def test_every_exit_status_a_loop_sets_is_in_the_vocabulary():
    assert set(LOOP_LIMITS) < set(LIMITS) < set(EXIT_STATUSES)
    ok = dict(status="ok", failure=None, info={}, terminated=False, truncated=False)
    assert exit_status(**{**ok, "truncated_by": "context"}) == "context"
    # the environment's word when it ended the episode: a submit in a reply the budget cut is submitted
    submitted = {**ok, "terminated": True, "info": {"exit_status": "submitted"}}
    assert exit_status(**{**submitted, "truncated_by": "max_tokens"}) == "submitted"
    assert exit_status(**{**submitted, "terminated": False, "truncated_by": "max_turns"}) == "max_turns"  # not ended
    assert exit_status(**{**ok, "terminated": True, "truncated_by": "max_tokens"}) == "max_tokens"  # math, cut
    assert exit_status(**{**ok, "truncated_by": None, "terminated": True}) == "terminated"
    assert exit_status(**{**ok, "truncated_by": None, "truncated": True}) == "truncated"
    assert exit_status(**{**ok, "status": "failed", "truncated_by": "max_turns", "failure": "env_error"}) == "env_error"


def record(exit_as: str, **kw: Any) -> Trajectory:
    info = {"correct": False, "answer": None, "error": None, "exit_status": exit_as, **kw.pop("info", {})}
    fields = dict(episode_id=exit_as, env="e", task_id="t", sample=0, seed=None, token_ids=(), action_mask=(),
                  logprobs=(), turns=(), messages=(), reward=0.0, terminated=True, truncated=False, status="ok",
                  error=None, info=info, wall_s=0.0)
    return Trajectory(**{**fields, **kw})


def test_the_summary_counts_exit_statuses_and_an_old_record_without_one():
    old = record("x", truncated=True, info={"truncated_by": "max_tokens"})
    old.info.pop("exit_status")
    failed = record("y", status="failed", failure="infra_error", error="boom")
    done = [record("submitted"), record("submitted"), record("max_turns"), old, failed]
    cfg = EvalConfig(benchmark="swe-local", output=Path("/nonexistent"), env_args={"autosubmit": False})
    assert exits_summary(cfg, done) == {"exit_status": {"infra_error": 1, "max_tokens": 1, "max_turns": 1,
                                                        "submitted": 2}, "autosubmit": False}


def test_the_warning_names_the_flags_above_five_percent():
    base = {"benchmark": "swe-local", "autosubmit": True}
    assert cut_warning({**base, "n_episodes": 20, "exit_status": {"submitted": 19, "max_turns": 1}}) is None  # 5%
    warning = cut_warning({**base, "n_episodes": 20, "exit_status": {"submitted": 17, "max_turns": 2,
                                                                      "context": 1}})
    assert "3 of 20 episodes (15%)" in warning and "--max-turns" in warning and "--max-model-len" in warning
    assert "graded as they stood (autosubmit)" in warning
    off = cut_warning({**base, "autosubmit": False, "n_episodes": 4, "exit_status": {"max_steps": 1, "max_tokens": 1}})
    assert "--max-steps" in off and "--max-tokens" in off and "--no-autosubmit" in off
    math = cut_warning({"benchmark": "arithmetic", "n_episodes": 2, "exit_status": {"max_turns": 1}})
    assert "--max-turns" in math and "autosubmit" not in math


def test_sao_eval_reports_cut_episodes_loudly(tmp_path, caplog):
    def wrong(request: dict, prompt: str) -> ServerReply:  # never right: the arithmetic env asks again
        return ServerReply(text="\\boxed{-1}")

    with FakeServer(responder=wrong, chat_only=True) as server, caplog.at_level(logging.WARNING, "sao.evals"):
        summary = evaluate(EvalConfig(benchmark="arithmetic", output=tmp_path / "out", base_url=server.base_url,
                                      model="hosted", endpoint_mode="chat", limit=3, max_turns=2, timeout_s=10.0,
                                      env_args={"feedback_turns": 5}))
    assert summary["exit_status"] == {"max_turns": 3} and summary["autosubmit"] is True
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["exit_status"] == {"max_turns": 3}
    assert any("3 of 3 episodes" in r.getMessage() and "--max-turns" in r.getMessage() for r in caplog.records)
    assert all(t.info["exit_status"] == "max_turns" for t in read_trajectories(tmp_path / "out" / "trajectories.jsonl"))


def test_the_console_shows_the_counts_and_the_warning(monkeypatch, tmp_path):
    import io

    from rich.console import Console

    from sao.evals import cli

    shown = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=shown, width=400))
    monkeypatch.setattr(cli, "Console", lambda: Console(file=shown, width=400))
    summary = {"benchmark": "swe-local", "model": "m", "agent": "llm", "n_tasks": 4, "samples_per_task": 1,
               "pass@k": {"1": 0.25}, "resolved": 1, "graded_by_fallback": 0, "infra_errors": 0, "env_errors": 0,
               "eval_errors": 0, "n_failed": 0, "n_truncated": 3, "tokens_generated": 9, "mode": "tokens",
               "wall_s": 1.0, "n_episodes": 4, "exit_status": {"max_turns": 3, "submitted": 1}, "autosubmit": True}
    cli._print_summary(summary, tmp_path)
    assert cli._report_problems(summary) == 0
    text = shown.getvalue()
    assert "max_turns 3, submitted 1" in text and "autosubmit" in text
    assert "WARNING: 3 of 4 episodes (75%) were cut by a limit" in " ".join(text.split())


def test_infra_and_eval_errors_of_a_cut_episode_are_not_predictions():
    broken = record("max_turns", truncated=True, info={"patch": FIX, "error": "grading failed: gone"})
    unjudged = record("max_turns", truncated=True, info={"patch": FIX, "eval_error": "cannot run its tests"})
    assert (Outcome.of(broken).kind, Outcome.of(broken).error) == ("error", "infra_error")
    assert (Outcome.of(unjudged).kind, Outcome.of(unjudged).error) == ("error", "eval_error")


# -- sao-eval swe-local, real Docker: a fix left unsubmitted, cut by --max-turns -------------------------

SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))


def fix_then_look(patch: str):
    """Native tool calls: write the fix, apply it, then `ls` for ever (never submit)."""

    def respond(request: dict, prompt: str) -> ServerReply:
        turn = sum(m["role"] == "assistant" for m in request["messages"])
        steps = [("editor", {"command": "create", "path": "/tmp/fix.patch", "file_text": patch}),
                 ("bash", {"command": "git apply /tmp/fix.patch && rm /tmp/fix.patch"})]
        name, args = steps[turn] if turn < len(steps) else ("bash", {"command": "ls"})
        return ServerReply(tool_calls=({"id": f"toolu_{turn}", "type": "function",
                                        "function": {"name": name, "arguments": json.dumps(args)}},))

    return respond


@pytest.mark.docker
@pytest.mark.part("sao-eval", "docker")
def test_sao_eval_grades_an_unsubmitted_fix_cut_by_max_turns(docker_client, tmp_path):
    env = E.make("swe-local")
    try:
        task_id = env.unwrapped.task_ids(1)[0]
        patch = env.unwrapped.get(task_id).patch
    finally:
        env.close()
    runs = {}
    for name, flags in (("auto", []), ("off", ["--no-autosubmit"])):
        out = tmp_path / name
        with FakeServer(responder=fix_then_look(patch), chat_only=True) as server:
            proc = subprocess.run([SAO_EVAL, "swe-local", "--limit", "1", "--max-turns", "3", "--base-url",
                                   server.base_url, "--model", "hosted", "--max-tokens", "100000", *flags,
                                   "--output", str(out)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "WARNING" in proc.stderr and "--max-turns" in proc.stderr
        (t,) = read_trajectories(out / "trajectories.jsonl")
        assert t.info["exit_status"] == t.info["truncated_by"] == "max_turns" and t.terminated and t.truncated
        runs[name] = (t, json.loads((out / "summary.json").read_text()), json.loads((out / "preds.json").read_text()))
    (t, summary, preds), (t_off, summary_off, preds_off) = runs["auto"], runs["off"]
    assert t.reward == 1.0 and t.info["report"]["status"] == "resolved" and t.info["patch"]
    assert summary["exit_status"] == {"max_turns": 1} and summary["autosubmit"] is True and summary["resolved"] == 1
    assert preds[task_id]["model_patch"] == t.info["patch"]
    assert t_off.reward == 0.0 and t_off.info["patch"] == "" and t_off.info["report"]["status"] == "empty_patch"
    assert t_off.info["unsubmitted_patch"] == t.info["patch"]
    assert summary_off["autosubmit"] is False and summary_off["resolved"] == 0 and preds_off[task_id]["model_patch"] == ""
