"""The "Bring your own agent" guide's example (examples/byo-agent: the plain ``openai`` SDK, registered through a
``sao.agents`` entry point), installed as a distribution, evaluated by ``sao-eval`` and trained by ``sao-train``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sao.agents.testing import FakeServer, Reply
from sao.agents.testing.fake_agents import solve
from sao.evals.cli import main
from tests.agent_plugins import with_path
from tests.faults.procs import SAO_TRAIN, jsonl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "byo-agent"


def install(target: Path) -> dict[str, str]:
    """``pip install`` the example into ``target``; the environment of a process that finds it there."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(EXAMPLE)], check=True, capture_output=True, timeout=300)
    return with_path(target)


def answering_on_second_ask(request: dict[str, Any], prompt: str) -> Reply:
    """No answer at the first call, the right one when asked again (the example's second call)."""
    asked_again = sum(m["role"] == "user" for m in request["messages"]) > 1
    return Reply(text=f"So it is \\boxed{{{solve(prompt)}}}." if asked_again else "Let me think.")


def test_the_guide_shows_the_example_as_it_is():
    guide = (EXAMPLE.parents[1] / "docs" / "guides" / "bring-your-own-agent.md").read_text()
    assert f"```python\n{(EXAMPLE / 'byo_agent.py').read_text()}```" in guide


@pytest.mark.slow
def test_the_guide_example_installed_as_a_distribution_is_evaluated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    env = install(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the agent's subprocess imports it from there
    monkeypatch.syspath_prepend(str(tmp_path / "site"))  # sao-eval finds its entry point there
    out = tmp_path / "out"
    with FakeServer(responder=answering_on_second_ask) as server:
        code = main(["arithmetic", "--agent", "byo-agent", "--base-url", server.base_url, "--model", "fake",
                     "--endpoint-mode", "chat", "--limit", "2", "--output", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0 and summary["agent"] == "byo-agent" and summary["pass@1"] == 1.0, summary
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["info"]["agent"]["steps"] for r in records] == [2, 2]
    assert all(r["info"]["capture"]["calls"] == 2 for r in records)  # both calls went through the proxy


@pytest.mark.vllm
@pytest.mark.long
@pytest.mark.part("sao-train")
@pytest.mark.timeout(1200)
def test_the_guide_example_is_trained_by_sao_train(tmp_path: Path) -> None:
    from tests.test_engine import require_vllm

    require_vllm()
    run = tmp_path / "run"
    args = [f"output_dir={run}", "agent=byo-agent", "env=arithmetic", "max_steps=2", "batch_size=2",
            "value_pretrain_steps=0", "eval.enabled=false", "logger=[]", "checkpoint_every=100",
            "keep_checkpoints=1", "engine.kv_cache_gib=1", "engine.extra_args=[-O0]", "agent_run.timeout_s=300",
            "agent_run.steps=2", "env.max_tokens_per_turn=128"]
    done = subprocess.run([SAO_TRAIN, *args], capture_output=True, text=True, timeout=1100, env=install(tmp_path / "site"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert [r["step"] for r in jsonl(run / "metrics.jsonl")] == [1, 2]
    trained = [t for t in jsonl(run / "trajectories.jsonl") if t["status"] == "ok"]
    assert len(trained) >= 4
    for t in trained:
        stats = t["info"]["capture"]["stats"]
        assert t["mode"] == "tokens" and sum(t["action_mask"]) > 0
        # the example asks for temperature 0.7; training samples at the run's 1.0: every call overridden
        assert stats["calls"] >= 1 and stats["pinned_calls"] == stats["calls"], stats
        assert stats["merged"] + stats["split"] == stats["calls"] - 1
