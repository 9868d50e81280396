"""``sao-train agent=NAME``: an agent plug-in trained unchanged, on real engines (issue 34).

The plug-in is the scripted ``ask_model`` agent (sao.agents.testing.fake_agents): the plain ``openai`` SDK
asking for temperature 0 and 64 tokens at most, registered through a distribution's entry point. The run
trains at temperature 1: the proxy pins the run's settings and records that it overrode the agent's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent_plugins import FAKE, with_path, write_dist_info
from tests.faults.procs import SAO_TRAIN, jsonl
from tests.test_engine import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.long, pytest.mark.part("sao-train")]


def register(folder: Path) -> dict[str, str]:
    """The environment of a process that finds the plug-in ``asker`` (a distribution's metadata on PYTHONPATH)."""
    return with_path(write_dist_info(folder, {"asker": f"{FAKE}:ask_model"}, "asker-agent"))


@pytest.mark.timeout(1200)
def test_sao_train_trains_an_agent_plugin_on_its_captured_tokens_with_the_run_sampling(tmp_path: Path) -> None:
    require_vllm()
    run = tmp_path / "run"
    args = [f"output_dir={run}", "agent=asker", "env=arithmetic", "max_steps=2", "batch_size=2",
            "value_pretrain_steps=0", "eval.enabled=false", "logger=[]", "checkpoint_every=100",
            "keep_checkpoints=1", "engine.kv_cache_gib=1", "engine.extra_args=[-O0]", "agent_run.timeout_s=300"]
    done = subprocess.run([SAO_TRAIN, *args], capture_output=True, text=True, timeout=1100, env=register(tmp_path / "dist"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    trained = [t for t in jsonl(run / "trajectories.jsonl") if t["status"] == "ok"]
    assert len(trained) >= 4
    for t in trained:
        capture = t["info"]["capture"]
        # one call each, captured as tokens: the prompt the proxy rendered, then the engine's sampled tokens
        assert t["mode"] == "tokens" and capture["calls"] == 1 and capture["stats"]["split"] == 0
        n_sampled = sum(t["action_mask"])
        assert 0 < n_sampled <= 64 and len(t["logprobs"]) == len(t["token_ids"])
        assert all(lp <= 0 for lp, m in zip(t["logprobs"], t["action_mask"], strict=True) if m)
        assert not any(lp for lp, m in zip(t["logprobs"], t["action_mask"], strict=True) if not m)
        # the agent asked for temperature 0; the run samples at 1: pinned, and recorded as overridden
        assert capture["stats"]["pinned_calls"] == 1, capture
        versions = {v for turn in t["turns"] for v, _ in (turn["token_versions"] or ())}
        assert versions and versions <= {0, 1}, t["turns"]
    # the learner's log-probs of the captured tokens match the engine's: the tokens are exactly what it sampled
    assert all(abs(r["rollout/logprob_gap"]) < 0.1 for r in rows), [r["rollout/logprob_gap"] for r in rows]
