"""``sao-eval --agent NAME`` with agent plug-ins (a test distribution's entry points, tests/agent_plugins.py):
one that answers through the plain ``openai`` SDK against the fake server (the pass-through seam: the
endpoint itself), one that raises and one that hangs; the summary counts the failed episodes and their
causes, and a resume keeps them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sao.agents.testing import FakeServer, Reply
from sao.agents.testing.fake_agents import solve
from sao.evals.cli import main
from tests.agent_plugins import FAKE, install_agents


@pytest.fixture(autouse=True)
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_agents(tmp_path / "dist", monkeypatch, {"asker": f"{FAKE}:ask_model", "crasher": f"{FAKE}:crash",
                                                    "sleeper": f"{FAKE}:hang"})


def answering(request: dict[str, Any], prompt: str) -> Reply:
    return Reply(text=f"It is \\boxed{{{solve(prompt)}}}.")


def sao_eval(server: FakeServer, out: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    code = main(["arithmetic", "--base-url", server.base_url, "--model", "fake", "--endpoint-mode", "chat",
                 "--limit", "3", "--output", str(out), *flags])
    summary = out / "summary.json"
    return code, json.loads(summary.read_text()) if summary.exists() else {}


def test_a_plugin_agent_plays_through_the_openai_sdk_and_is_graded(tmp_path: Path):
    with FakeServer(responder=answering) as server:
        code, summary = sao_eval(server, tmp_path / "out", "--agent", "asker")
    assert code == 0 and summary["agent"] == "asker" and summary["model"] == "fake"
    assert summary["pass@1"] == 1.0 and summary["n_failed"] == 0 and summary["agent_errors"] == 0
    assert summary["exit_status"] == {"agent_returned": 3} and summary["mode"] == "text"
    # one call each through its session of the capture proxy (text mode: nothing to merge or split)
    assert summary["capture"] == {"episodes": 3, "uncaptured": 0, "calls": 3, "merged": 0, "split": 0,
                                  "split_reasons": {}, "pinned_calls": 0, "failed_calls": 0}
    chats = [r for r in server.requests if "messages" in r]
    assert len(chats) == 3 and all(r["model"] == "fake" and r["temperature"] == 0.0 for r in chats)
    assert len({r["seed"] for r in chats}) == 3  # each episode's own seed reached the agent
    lines = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["info"]["agent"]["name"] == "asker" for line in lines)


def test_failing_agents_are_counted_by_cause_and_the_run_goes_on(tmp_path: Path):
    with FakeServer(responder=answering) as server:
        code, crashed = sao_eval(server, tmp_path / "crash", "--agent", "crasher")
        assert code == 0 and crashed["n_failed"] == 3 and crashed["agent_errors"] == 3
        assert crashed["infra_errors"] == 0 and crashed["pass@1"] == 0.0
        assert crashed["exit_status"] == {"agent_error": 3}
        code, hung = sao_eval(server, tmp_path / "hang", "--agent", "sleeper", "--agent-timeout", "2", "--limit", "2")
        assert code == 0 and hung["exit_status"] == {"agent_timeout": 2} and hung["agent_errors"] == 2
        code, resumed = sao_eval(server, tmp_path / "crash", "--agent", "crasher", "--resume")  # kept, not re-run
    assert code == 0 and resumed["agent_errors"] == 3
    assert len((tmp_path / "crash" / "trajectories.jsonl").read_text().splitlines()) == 3
    record = json.loads((tmp_path / "crash" / "trajectories.jsonl").read_text().splitlines()[0])
    assert record["status"] == "failed" and record["failure"] == "agent_error"
    assert record["error"].startswith("agent_error: the agent raised RuntimeError: the agent broke on")


def test_an_unknown_agent_and_misplaced_agent_flags_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with FakeServer(responder=answering) as server:
        assert sao_eval(server, tmp_path / "a", "--agent", "askr")[0] == 2
        assert "no agent plug-in 'askr'; did you mean 'asker'?" in capsys.readouterr().err
        assert sao_eval(server, tmp_path / "b", "--agent-timeout", "5")[0] == 2
        assert "--agent-timeout and --agent-steps are for an agent plug-in" in capsys.readouterr().err
        assert sao_eval(server, tmp_path / "c", "--agent", "asker", "--agent-steps", "0")[0] == 2
        assert "--agent-steps must be >= 1" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.part("sao-eval")
def test_a_plugin_agent_against_the_real_engine_is_evaluated(vllm_server, tmp_path: Path):
    """The plain openai SDK agent against vLLM's chat route (temperature 0, seeded): any answer the small
    model gives is graded; every episode ends graded, none fails."""
    code = main(["arithmetic", "--agent", "asker", "--base-url", vllm_server.base_url, "--model",
                 vllm_server.model_name, "--endpoint-mode", "chat", "--limit", "2", "--output", str(tmp_path / "o")])
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert code == 0 and summary["n_episodes"] == 2 and summary["n_failed"] == 0
    assert summary["exit_status"] == {"agent_returned": 2} and summary["model"] == vllm_server.model_name
    records = [json.loads(line) for line in (tmp_path / "o" / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" and r["info"]["agent"]["steps"] == 1 and "gold" in r["info"] for r in records)
