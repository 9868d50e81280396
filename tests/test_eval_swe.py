"""`sao-eval` on SWE tasks with scripted agents (real Docker, real swebench grading), and on math without a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shared_file

SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))


@pytest.fixture(scope="module")
def docker_client():
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("SAO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"a Docker daemon is required here (SAO_REQUIRE_DOCKER=1) but none answers: {exc}")
        pytest.skip(f"no Docker daemon answers: {exc}")
    return client


def _ours(client) -> list:
    from sao.sandboxes import LABEL_KEY

    return client.containers.list(all=True, filters={"label": LABEL_KEY})


@pytest.mark.docker
@pytest.mark.parametrize("agent, resolved", [("gold", "all"), ("empty", 0)])
def test_sao_eval_swe_local_scripted_agents(docker_client, tmp_path, agent, resolved):
    out = tmp_path / agent
    proc = subprocess.run([SAO_EVAL, "swe-local", "--agent", agent, "--concurrency", "2", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_instances"] >= 5 and summary["infra_errors"] == 0
    assert summary["resolved"] == (summary["n_instances"] if resolved == "all" else 0)
    assert not (out / "vllm.log").exists()  # no engine for a scripted agent
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert all(t["info"]["report"] for t in trajectories if agent == "gold")
    assert _ours(docker_client) == []


def test_partial_swebench_copy_names_the_missing_fields(tmp_path):
    data = shared_file("swebench_partial/swebench_verified.jsonl")
    proc = subprocess.run([SAO_EVAL, "swe-bench-verified", "--data", str(data), "--limit", "1", "--output",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    for field in ("test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "version", "environment_setup_commit"):
        assert field in proc.stderr


def test_math_gold_agent_needs_no_engine(tmp_path):
    out = tmp_path / "gold"
    proc = subprocess.run([SAO_EVAL, "beyond-aime", "--data", str(shared_file("beyond_aime.jsonl")), "--agent", "gold",
                           "--limit", "10", "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass@1"] == 1.0 and summary["resolved"] == 10 and summary["tokens_generated"] == 0
    proc = subprocess.run([SAO_EVAL, "beyond-aime", "--data", str(shared_file("beyond_aime.jsonl")), "--agent",
                           "empty", "--limit", "3", "--output", str(tmp_path / "empty")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and json.loads((tmp_path / "empty" / "summary.json").read_text())["pass@1"] == 0.0
