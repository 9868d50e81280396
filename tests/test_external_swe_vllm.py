"""Issue 34's contract, end to end: ``sao-eval swe-local --agent mini-swe-agent --limit 2`` on a real vLLM that
sao-eval starts itself, with the bundled model.

mini-swe-agent runs unchanged in a subprocess per episode, in its own Docker container on the task's image,
against its session of the capture proxy, which samples on token ids (exact tokens). The 135M model does not fix a bug,
and the agent samples unseeded at its own temperature, so the test asserts the contract, not a sample: exit 0;
two records, each holding captured token ids (tokens mode, action tokens with the engine's log-probs) or a
recorded failed episode with its cause; the summary's capture counts equal the sums over the records; the
SWE brief's setup command ran in the agent's container; no container of the episodes is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_engine import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.docker, pytest.mark.slow, pytest.mark.long,
              pytest.mark.part("sao-eval", "docker")]

SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))
SETUP_LINE = "mini-swe-agent: the task's setup_command ran in the agent's container (exit 0)"
COUNTED = ("calls", "merged", "split", "pinned_calls", "failed_calls")


def check_captured(r: dict[str, Any]) -> None:
    """An episode that called the model holds what the engine sampled, segment by segment (or says why not)."""
    stats, turns = r["info"]["capture"]["stats"], r["turns"]
    assert len(turns) == stats["calls"], (len(turns), stats)
    if not stats["calls"]:  # nothing to hold (a record without tokens reads as text)
        assert not r["token_ids"] and r["status"] == "failed", r["error"]
        return
    assert r["mode"] == "tokens"
    ids, mask, logprobs = r["token_ids"], r["action_mask"], r["logprobs"]
    assert ids and len(ids) == len(mask) == len(logprobs)
    sampled = [lp for m, lp in zip(mask, logprobs) if m]
    assert len(sampled) == sum(t["completion_len"] for t in turns) > 0
    assert all(lp <= 0.0 for lp in sampled) and any(lp < 0.0 for lp in sampled)  # the engine's, not filler
    assert not any(lp for m, lp in zip(mask, logprobs) if not m)  # prompt and observation tokens: 0.0
    segments = r["segments"]
    assert [s["reason"] for s in segments[:1]] == ["first"] and segments[-1]["end"] == len(ids)
    assert len(segments) == stats["split"] + 1 and stats["merged"] + len(segments) == stats["calls"]
    assert sum(stats["split_reasons"].values()) == stats["split"]


def test_sao_eval_swe_local_with_mini_swe_agent_captures_its_calls(docker_client, tmp_path: Path) -> None:
    pytest.importorskip("minisweagent", reason="mini-swe-agent is an optional extra: pip install -e '.[agents-mini-swe]'")
    require_vllm()
    out = tmp_path / "swe-mini"
    # three model calls per episode, 128 tokens each, in a 4,096-token context (mini-swe-agent's SWE prompt
    # with the tool prompt is about 1,450 of the bundled model's tokens)
    t0 = time.monotonic()
    proc = subprocess.run([SAO_EVAL, "swe-local", "--agent", "mini-swe-agent", "--limit", "2", "--agent-steps", "3",
                           "--max-tokens-per-turn", "128", "--max-model-len", "4096", "--agent-timeout", "600",
                           "--output", str(out)], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "COLUMNS": "200"})
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert len(records) == 2 and summary["n_episodes"] == 2 and summary["agent"] == "mini-swe-agent"
    assert summary["infra_errors"] == 0 and summary["env_errors"] == 0, summary
    for r in records:
        agent = r["info"]["agent"]
        if r["status"] == "failed":  # the agent's own failure, recorded with its cause, never a 0 that looks graded
            assert r["failure"] == "agent_error" and r["error"] and r["info"]["exit_status"] in (
                "agent_error", "agent_timeout"), (r["error"], agent.get("log_tail"))
        else:
            assert r["info"]["exit_status"] == "agent_returned" and r["info"]["error"] is None
            assert r["reward"] in (0.0, 1.0) and isinstance(r["info"].get("report"), dict), r["info"]
            assert agent["info"]["setup_command_ran"] is True and agent["containers_removed"] == []
            assert r["info"]["capture"]["stats"]["calls"] >= 1  # an agent that returned called the model
        check_captured(r)
        log = (out / "agents" / r["episode_id"] / "agent.log").read_text(errors="replace")
        assert SETUP_LINE in log or r["status"] == "failed", log[-2000:]
    # the summary's counts are the sums over the records, and the table prints them
    counts = summary["capture"]
    for key in COUNTED:
        assert counts[key] == sum(r["info"]["capture"]["stats"][key] for r in records), key
    assert counts["episodes"] == 2 and counts["uncaptured"] == 0 and counts["calls"] >= 1
    reasons: dict[str, int] = {}
    for r in records:
        for k, v in r["info"]["capture"]["stats"]["split_reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    assert counts["split_reasons"] == dict(sorted(reasons.items()))
    table = proc.stdout.replace("│", " ")
    assert f"{counts['merged']} / {counts['split']}" in table and "captured calls" in table, proc.stdout
    # no container of the episodes is left: neither the agent's own nor a grading one
    left = [c.name for r in records for c in docker_client.containers.list(
        all=True, filters={"label": f"io.sao.sandbox.episode={r['episode_id']}"})]
    assert not left, f"containers left: {left}"
    print(f"\nsao-eval wall {wall:.0f} s; per episode (status, calls, merged, split, reward): "
          + "; ".join(f"{r['task_id']}: {r['status']}, {r['info']['capture']['stats']['calls']}, "
                      f"{r['info']['capture']['stats']['merged']}, {r['info']['capture']['stats']['split']}, "
                      f"{r['reward']}" for r in records))
