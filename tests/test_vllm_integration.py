"""End to end against the real vLLM serving the bundled SmolLM2-135M-Instruct."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sao.envs as E
from sao.agents import ChatRenderer, LoopConfig, OpenAICompletionClient, run_episode
from sao.agents.store import read_trajectories
from tests.conftest import shared_file

pytestmark = pytest.mark.vllm
SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))
SUMMARY_KEYS = {"benchmark", "model", "n_tasks", "samples_per_task", "pass@1", "pass@k", "graded_by_fallback",
                "tokens_generated", "wall_s"}


def _check_outputs(out: Path, n_tasks: int, samples: int) -> dict:
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == n_tasks and all(len(r["correct"]) == samples for r in results)
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert len(trajectories) == n_tasks * samples
    assert len({(t.task_id, t.sample) for t in trajectories}) == n_tasks * samples
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        record = json.loads(line)
        n = len(record["token_ids"])
        assert n > 0 and len(record["action_mask"]) == n and len(record["logprobs"]) == n
        assert sum(record["action_mask"]) > 0
        assert all(lp <= 0.0 and math.isfinite(lp) for lp, m in zip(record["logprobs"], record["action_mask"]) if m)
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["n_tasks"] == n_tasks and summary["samples_per_task"] == samples
    assert summary["tokens_generated"] == sum(t.num_action_tokens for t in trajectories) > 0
    assert summary["pass@1"] == pytest.approx(sum(sum(r["correct"]) for r in results) / (n_tasks * samples))
    return summary


# `sao-eval` with its own engine (no --base-url) is checked by the same _check_outputs in
# tests/faults/test_eval_faults.py, whose run starts its own engine (and a second one after the kill).


@pytest.mark.part("sao-eval")
def test_sao_eval_imo_answerbench_from_local_csv(vllm_server, tmp_path):
    out = tmp_path / "imo"
    proc = subprocess.run([SAO_EVAL, "imo-answerbench", "--data", str(shared_file("answerbench_v2.csv")), "--limit",
                           "4", "--samples", "1", "--max-tokens", "96", "--base-url", vllm_server.base_url,
                           "--model", vllm_server.model_name, "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_outputs(out, 4, 1)


@pytest.mark.long
def test_resume_after_kill_loses_and_duplicates_nothing(vllm_server, tmp_path):
    out = tmp_path / "killed"
    args = [SAO_EVAL, "arithmetic", "--limit", "12", "--samples", "2", "--max-tokens", "48", "--concurrency", "2",
            "--base-url", vllm_server.base_url, "--model", vllm_server.model_name, "--output", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    traj = out / "trajectories.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if traj.exists() and traj.read_text().count("\n") >= 5:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = read_trajectories(traj)
    assert 5 <= len(before) < 24
    resumed = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _check_outputs(out, 12, 2)
    after = read_trajectories(traj)
    assert [t.episode_id for t in after[:len(before)]] == [t.episode_id for t in before]  # kept, not re-run


class _Recording:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    async def complete(self, prompt_ids, params):
        completion = await self.inner.complete(prompt_ids, params)
        self.calls.append((list(prompt_ids), completion))
        return completion


@pytest.mark.part("vllm-generation")
def test_multi_turn_tokens_and_logprobs_match_the_server_and_the_model(vllm_server, smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)

    async def go():
        client = _Recording(OpenAICompletionClient(vllm_server.base_url, vllm_server.model_name))
        try:
            # wrong answers get feedback: several turns. Greedy (temperature 0) pins the sample: SmolLM2-135M's
            # greedy answer to a 4-digit product is wrong, so the episode takes the feedback turn.
            env = E.make("arithmetic", feedback_turns=2)
            return await run_episode(env, client, ChatRenderer(tokenizer), LoopConfig(max_tokens=160, max_turns=3,
                                     max_tokens_per_turn=48, temperature=0.0), env_name="arithmetic", task_id="mul-d4-s0-i1",
                                     seed=3), client.calls
        finally:
            await client.inner.aclose()

    t, calls = asyncio.run(go())
    assert t.status == "ok" and len(t.turns) >= 2, t.error
    sent, last = calls[-1]
    assert last.prompt_ids is not None and list(last.prompt_ids) == sent  # what the server saw
    assert list(t.token_ids) == list(last.prompt_ids) + list(last.token_ids)
    for turn, (prompt, completion) in zip(t.turns, calls):
        assert turn.prompt_len == len(prompt) and turn.completion_len == len(completion.token_ids)
        assert list(t.token_ids[turn.prompt_len:turn.prompt_len + turn.completion_len]) == list(completion.token_ids)
        assert t.action_mask[turn.prompt_len:turn.prompt_len + turn.completion_len] == (1,) * turn.completion_len
    assert sum(t.action_mask) == sum(len(c.token_ids) for _, c in calls)
    # The engine's log-probs agree with the model's own on the same tokens (bf16 engine vs fp32 HF).
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    ids = torch.tensor([t.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    ours = logp.gather(-1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(t.action_mask[1:], dtype=torch.bool)
    diff = (ours[mask] - torch.tensor(t.logprobs[1:])[mask]).abs()
    assert diff.mean() < 0.1 and diff.max() < 1.5, (diff.mean(), diff.max())


@pytest.mark.docker
@pytest.mark.long
def test_smollm2_agent_on_a_local_swe_task_is_run_and_graded(vllm_server, tmp_path):
    """The whole SWE path with the real model: tools, container, diff, fresh grading container, swebench.

    SmolLM2-135M is not expected to fix the bug; the test asserts that the episode runs to an end that
    the environment grades (submit, format errors or its step limit), with a report and no infrastructure error.
    """
    out = tmp_path / "swe-llm"
    proc = subprocess.run([SAO_EVAL, "swe-local", "--limit", "1", "--max-turns", "8", "--max-tokens", "768",
                           "--env-arg", "max_steps=4", "--base-url", vllm_server.base_url, "--model",
                           vllm_server.model_name, "--output", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (t,) = read_trajectories(out / "trajectories.jsonl")
    assert t.status == "ok" and t.num_action_tokens > 0 and len(t.turns) >= 1
    if t.info.get("truncated_by") == "context":
        pytest.fail(f"the SWE prompt does not fit the test server's context ({len(t.token_ids)} tokens)")
    # Any sample ends one of two ways, both graded: the environment ends it (submit, format errors, its
    # step limit); or the agent loop's own budget (tokens, turns) cuts it first, recorded as truncated with
    # `truncated_by`, and the environment grades the diff then (CutGrading). A sampled model decides which.
    summary = json.loads((out / "summary.json").read_text())
    assert summary["infra_errors"] == 0 and summary["n_instances"] == 1
    assert sum(summary["exit_status"].values()) == 1 and summary["exit_status"][t.info["exit_status"]] == 1
    assert isinstance(t.info["report"], dict) and t.info["error"] is None and t.info["correct"] in (True, False)
    if t.info["exit_status"] in ("max_tokens", "max_turns"):
        assert t.truncated and t.terminated and t.info["truncated_by"] == t.info["exit_status"], t.info
        assert summary["n_truncated"] == 1
    else:
        assert t.info["exit_status"] in ("submitted", "format_errors", "max_steps"), t.info["exit_status"]
