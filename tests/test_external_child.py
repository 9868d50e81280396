"""agents/external/child.py and process.py: an agent in its own subprocess, its outcome in a result file, a
hung one killed with everything it spawned."""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
from pathlib import Path

import pytest

from sao.agents.external import child
from sao.agents.external.process import run_child
from sao.agents.external.task import AgentEndpoint, AgentResult, AgentTask
from sao.agents.external.wire import ChildError, Job, job_to_json, outcome_from_json
from tests.agent_plugins import FAKE

TASK = AgentTask(env="arithmetic", task_id="add-d1-s0-i0", episode_id="e0", prompt="What is 3 + 4?")
ENDPOINT = AgentEndpoint("http://127.0.0.1:9/v1", "fake")


def job(name: str) -> Job:
    return Job(f"{FAKE}:{name}", TASK, ENDPOINT)


def run(name: str, tmp_path: Path, timeout_s: float = 60.0):  # type: ignore[no-untyped-def]
    return asyncio.run(run_child(job(name), tmp_path, timeout_s=timeout_s))


def test_a_sync_agent_returns_its_result(tmp_path: Path):
    ran = run("gold", tmp_path)
    assert ran.outcome == AgentResult(answer="\\boxed{7}", steps=0, info={"by": "gold"})
    assert not ran.timed_out and ran.returncode == 0 and ran.problem is None


def test_a_coroutine_agent_runs_through_asyncio(tmp_path: Path):
    assert run("gold_async", tmp_path).outcome == AgentResult(answer="7", steps=0)


def test_an_agent_that_prints_keeps_its_result_apart_from_its_output(tmp_path: Path):
    ran = run("loud", tmp_path)
    assert ran.outcome == AgentResult(answer="7", info={"by": "loud"})  # a dict of the fields is taken
    assert '{"ok": false} printed on stdout' in ran.log_tail and "noise on stderr" in ran.log_tail


def test_an_agent_that_raises_gives_a_structured_error(tmp_path: Path):
    ran = run("crash", tmp_path)
    assert isinstance(ran.outcome, ChildError) and ran.returncode == 1
    assert ran.outcome.type == "RuntimeError" and ran.outcome.message == "the agent broke on add-d1-s0-i0"
    assert "fake_agents.py" in ran.outcome.traceback and "in crash" in ran.outcome.traceback


def test_a_hung_agent_is_killed_at_its_timeout_with_the_process_it_spawned(tmp_path: Path):
    started = time.monotonic()
    ran = run("hang", tmp_path, timeout_s=3.0)
    assert ran.timed_out and ran.outcome is None and ran.returncode == -9
    assert 3.0 <= time.monotonic() - started < 20.0
    spawned = int((tmp_path / "spawned.pid").read_text())
    assert not alive(spawned)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper is dead)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return False
        if "\nState:\tZ" in state:
            return False
        time.sleep(0.1)
    return True


def test_an_unknown_target_and_a_wrong_return_are_errors_not_crashes(tmp_path: Path):
    ok, text = child.run(job_to_json(Job("no_such_module_for_sao_tests:run", TASK, ENDPOINT)))
    assert not ok and outcome_from_json(text).type == "ModuleNotFoundError"
    ok, text = child.run(job_to_json(Job("builtins:len", TASK, ENDPOINT)))  # len(task, endpoint): TypeError
    assert not ok and outcome_from_json(text).type == "TypeError"
    ok, text = child.run(job_to_json(Job("builtins:slice", TASK, ENDPOINT)))  # returns a slice
    assert not ok and "must return an AgentResult (or a dict of its fields), got slice" in outcome_from_json(text).message


def test_main_reads_the_job_on_stdin_and_refuses_a_bad_command_line(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(job_to_json(job("gold"))))
    result = tmp_path / "result.json"
    assert child.main(["-", str(result)]) == 0
    assert json.loads(result.read_text())["result"]["answer"] == "\\boxed{7}"
    assert not os.path.exists(str(result) + ".tmp")
    assert child.main(["only-one"]) == 2


def test_a_torn_result_file_is_reported_not_trusted(tmp_path: Path):
    with pytest.raises(ValueError, match="not an agent outcome"):
        outcome_from_json('{"answer": "7"}')
    with pytest.raises(TypeError, match="no field"):
        outcome_from_json('{"ok": true, "result": {"answer": "7", "score": 1}}')
