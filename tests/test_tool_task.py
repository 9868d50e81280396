"""The tool task's records and its one command (issue 35), with scripted parts: a held-out episode's record in
``eval.jsonl`` shows the tool call and the answer in separate turns; tool calls and model calls per episode
are logged for held-out evaluations and training batches. The real run is tests/test_tool_task_vllm.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from sao.agents import ByteTokenizer, ChatRenderer, LoopConfig, OpenAICompletionClient
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.rl.rollout.sources import rollout_metrics
from sao.rl.training.heldout import HeldOutEval, episode_turns, load_results
from sao.rl.warm_start import arithmetic_tool
from test_train import FAST

HELDOUT = {"seed": 0, "difficulty": 1.0, "ops": "*", "max_digits": 3, "tools": "python", "split": "test"}


def renderer_for(tools):  # type: ignore[no-untyped-def]
    return ChatRenderer(ByteTokenizer(), tools)


def heldout(server: FakeServer, path: Path, problems: int = 3) -> HeldOutEval:
    client = OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST)
    loop = LoopConfig(max_turns=3, max_tokens=192, max_model_len=1024, temperature=0.0)
    return HeldOutEval(client=client, renderer_for=renderer_for, env_name="arithmetic", env_kwargs=HELDOUT, loop=loop,
                       problems=problems, concurrency=2, path=path)


def test_a_heldout_record_shows_the_tool_call_and_the_answer_in_separate_turns(tmp_path: Path) -> None:
    """The engine answers as the demonstrator does: per episode the record holds the problem (user), the call
    (assistant, its tool call parsed), the tool's output (tool: the product, computed in the sandbox) and the
    answer (assistant, \\boxed{product}, no call); one tool call and two model calls per episode."""
    path = tmp_path / "eval.jsonl"
    with FakeServer(responder=lambda request, prompt: Reply(text=arithmetic_tool(prompt))) as server:
        result = asyncio.run(heldout(server, path).run(0))
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == 3 and all(r["correct"] and r["status"] == "ok" for r in rows)
    for row in rows:
        assert [t["role"] for t in row["turns"]] == ["user", "assistant", "tool", "assistant"]
        problem, call, output, answer = row["turns"]
        x, y = problem["text"].split("?")[0].removeprefix("What is ").split(" * ")
        product = int(x) * int(y)
        assert call["tool_calls"] == [{"name": "python", "arguments": json.dumps({"code": f"print({x} * {y})"})}]
        assert "\\boxed" not in call["text"] and output["text"].strip() == str(product)
        assert "tool_calls" not in answer and answer["text"] == f"The answer is \\boxed{{{product}}}."
    m = result.metrics()
    assert (m["eval/tool_calls_mean"], m["eval/turns_mean"], m["eval/accuracy"]) == (1.0, 2.0, 1.0)
    assert load_results(path) == {0: {r["task_id"]: True for r in rows}}  # the rows stay readable as before


def test_an_episode_without_a_call_logs_no_tool_call_and_one_turn(tmp_path: Path) -> None:
    """A model that answers at once (wrongly) in its first turn: one model call, no tool call, one assistant
    turn in the record; training batches count the same way (rollout/tool_calls_mean)."""
    path = tmp_path / "eval.jsonl"
    with FakeServer(responder=lambda request, prompt: Reply(text="\\boxed{7}")) as server:
        result = asyncio.run(heldout(server, path, problems=2).run(4))
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert all([t["role"] for t in r["turns"]] == ["user", "assistant"] and not r["correct"] for r in rows)
    assert all("tool_calls" not in r["turns"][1] and r["step"] == 4 for r in rows)
    m = result.metrics()
    assert (m["eval/tool_calls_mean"], m["eval/turns_mean"], m["eval/accuracy"]) == (0.0, 1.0, 0.0)
    batch = rollout_metrics(result.samples, result.samples, 1.0)
    assert (batch["rollout/tool_calls_mean"], batch["rollout/turns_mean"]) == (0.0, 1.0)
    assert [t.role for t in episode_turns(result.samples[0])] == ["user", "assistant"]
