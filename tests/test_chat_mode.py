"""Text mode: `sao-eval` against chat endpoints that return no token ids (hosted APIs), end to end
against the scripted fake server in its chat-only mode (real HTTP on localhost)."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import sao.envs as E
from sao.agents import (
    EngineUnavailableError,
    LoopConfig,
    OpenAIChatClient,
    RetryPolicy,
    SamplingParams,
    Trajectory,
    TurnRecord,
    run_text_episode,
)
from sao.agents.chat.history import NO_RESULT, api_messages
from sao.agents.clients.chat import parse_chat_completion
from sao.agents.clients.endpoint import open_endpoint
from sao.agents.clients.probe import probe_mode
from sao.agents.loop.text_loop import spent_tokens
from sao.agents.loop.tools import check_native_tool_calls
from sao.agents.store import read_trajectories
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.envs.arithmetic import make_task
from sao.evals.runner import EvalConfig, EvalError, evaluate
from tests.conftest import SHARED_DATA

SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))
FAST = RetryPolicy(max_retries=2, backoff_s=0.01, max_backoff_s=0.02)
TASK = "mul-d1-s0-i0"
GOLD = make_task("mul", 1, 0, 0).answer
_QUESTION = re.compile(r"What is (\d+) ([-+*/]) (\d+)\?")


def arithmetic_answer(prompt: str) -> int:
    a, op, b = _QUESTION.search(prompt).groups()  # type: ignore[union-attr]
    a, b = int(a), int(b)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]


def solver(request: dict, prompt: str) -> Reply:
    """Right on even seeds, off by one on odd ones (so pass@2 > pass@1 is possible)."""
    value = arithmetic_answer(prompt) + int(request.get("seed") or 0) % 2
    return Reply(text=f"The answer is \\boxed{{{value}}}.")


def native(name: str, arguments: str | dict, call_id: str) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def text_episode(server: FakeServer, *, cfg: LoopConfig = LoopConfig(max_tokens=256), retry: RetryPolicy = FAST,
                 **env_args) -> Trajectory:
    async def go() -> Trajectory:
        client = OpenAIChatClient(server.base_url, "fake", timeout_s=5.0, retry=retry)
        try:
            env = E.make("arithmetic", **env_args)
            try:
                return await run_text_episode(env, client, cfg, env_name="arithmetic", task_id=TASK, seed=7)
            finally:
                env.close()
        finally:
            await client.aclose()

    return asyncio.run(go())


# -- the text loop --------------------------------------------------------------------------------


def test_text_episode_records_text_turns_and_usage_and_is_not_trainable():
    with FakeServer([Reply(text="maybe 3"), Reply(text=f"\\boxed{{{GOLD}}}")], chat_only=True) as server:
        t = text_episode(server, feedback_turns=2)
    assert t.status == "ok" and t.terminated and t.correct and t.reward == 1.0
    assert t.mode == "text" and not t.trainable and t.token_ids == t.action_mask == t.logprobs == ()
    assert [m["role"] for m in t.messages] == ["user", "assistant", "user", "assistant"]
    assert t.messages[3]["content"] == f"\\boxed{{{GOLD}}}"
    assert all(turn.prompt_tokens and turn.completion_tokens for turn in t.turns)
    assert t.generated_tokens == sum(turn.completion_tokens for turn in t.turns)
    first, second = server.requests
    assert set(first) >= {"messages", "max_tokens", "temperature", "top_p", "seed"} and "prompt" not in first
    assert "return_token_ids" not in first and "tools" not in first  # arithmetic offers no tools
    assert first["seed"] == 7000 and second["seed"] == 7001  # seed * 1000 + turn, as in the token loop
    assert second["messages"][1:] == [{"role": "assistant", "content": "maybe 3"}, t.messages[2]]
    assert Trajectory.from_json(t.to_json()) == t


def test_old_records_read_as_tokens_mode_and_text_mode_holds_no_tokens():
    t = Trajectory("e", "arithmetic", TASK, 0, None, (1, 2), (0, 1), (0.0, -0.5),
                   (TurnRecord(1, 1, "stop", None, 0.0, 1.0),), ({"role": "user", "content": "q"},), 0.0, True, False,
                   "ok")
    record = json.loads(t.to_json())  # as written before the text mode existed
    del record["mode"]
    for turn in record["turns"]:
        del turn["prompt_tokens"], turn["completion_tokens"]
    old = Trajectory.from_json(json.dumps(record))
    assert old == t and old.mode == "tokens" and old.trainable and old.generated_tokens == 1
    with pytest.raises(ValueError, match="text-mode trajectory has no tokens"):
        Trajectory("e", "arithmetic", TASK, 0, None, (1,), (1,), (0.0,), (), (), 0.0, True, False, "ok", mode="text")
    with pytest.raises(ValueError, match="mode must be one of"):
        Trajectory("e", "arithmetic", TASK, 0, None, (), (), (), (), (), 0.0, True, False, "ok", mode="chat")


def test_budget_counts_usage_then_an_estimate_and_a_length_cut_ends_truncated():
    # The fake chat route reports one token per byte: "a" * 10 spends 10; "b" * 10 without usage ceil(10 / 4) = 3.
    with FakeServer([Reply(text="a" * 10), Reply(text="b" * 10, usage=False), Reply(text="c" * 100)],
                    chat_only=True) as server:
        t = text_episode(server, cfg=LoopConfig(max_tokens=30), feedback_turns=5)
    assert [r["max_tokens"] for r in server.requests] == [30, 20, 17]  # 30 - 10 (usage), then - ceil(10 / 4)
    assert t.turns[1].completion_tokens is None and t.turns[2].finish_reason == "length"
    assert t.status == "ok" and t.truncated and not t.terminated and t.info["truncated_by"] == "max_tokens"
    assert t.info["correct"] is False and t.info["answer"] is None
    # Without usage, a reply cut by `length` spends all it was given.
    from sao.agents import ChatCompletion

    assert spent_tokens(ChatCompletion(text="x", finish_reason="length"), 17) == 17
    assert spent_tokens(ChatCompletion(text="x" * 9, finish_reason="stop", completion_tokens=5), 17) == 5


def test_max_turns_context_overflow_and_engine_failure_end_as_in_the_token_loop():
    with FakeServer(responder=lambda req, prompt: Reply(text="no idea"), chat_only=True) as server:
        t = text_episode(server, cfg=LoopConfig(max_turns=2), feedback_turns=5)
    assert t.truncated and t.info["truncated_by"] == "max_turns" and len(t.turns) == 2
    overflow = Reply(status=400, error="This model's maximum context length is 8192 tokens.")
    with FakeServer([overflow], chat_only=True) as server:
        t = text_episode(server)
    assert t.status == "ok" and t.truncated and t.info["truncated_by"] == "context" and t.turns == ()
    with FakeServer([Reply(status=503), Reply(text=f"\\boxed{{{GOLD}}}")], chat_only=True) as server:
        t = text_episode(server)
    assert t.correct and t.turns[0].attempts == 2
    with FakeServer(responder=lambda req, prompt: Reply(status=500), chat_only=True) as server:
        t = text_episode(server)
    assert t.status == "failed" and "EngineUnavailableError" in t.error and t.info["correct"] is False
    with FakeServer([Reply(raw=b'{"choices": []}')], chat_only=True) as server:
        t = text_episode(server)
    assert t.status == "failed" and "EngineResponseError" in t.error


def test_native_python_tool_call_keeps_its_id_and_the_result_goes_back_as_a_tool_message():
    calls = (native("python", {"code": "print(9 * 2)"}, "call_abc"),)
    with FakeServer([Reply(tool_calls=calls), Reply(text="\\boxed{18}")], chat_only=True) as server:
        t = text_episode(server, tools="python")
    assert t.status == "ok" and t.correct, t.error
    action, result = t.messages[1], t.messages[2]
    assert action["tool_calls"][0]["id"] == "call_abc" and "invalid_tool_calls" not in action
    assert result["role"] == "tool" and result["tool_call_id"] == "call_abc" and "18" in result["content"]
    first, second = server.requests
    assert first["tools"][0]["function"]["name"] == "python" and first["tool_choice"] == "auto"
    assert second["messages"][1] == {"role": "assistant", "content": None, "tool_calls": list(calls)}
    assert second["messages"][2] == {"role": "tool", "tool_call_id": "call_abc", "content": result["content"]}


def test_malformed_native_tool_call_is_recorded_and_the_episode_goes_on():
    bad = (native("python", "{not json", "call_bad"),)
    with FakeServer([Reply(tool_calls=bad), Reply(text=f"\\boxed{{{GOLD}}}")], chat_only=True) as server:
        t = text_episode(server, tools="python")
    assert t.status == "ok" and t.correct
    action = t.messages[1]
    assert "tool_calls" not in action and "not valid JSON" in action["invalid_tool_calls"][0]
    # The env's report of it (a tool message answering no valid call) reaches the API as a user message.
    sent = server.requests[1]["messages"]
    assert sent[1] == {"role": "assistant", "content": ""}
    assert sent[2]["role"] == "user" and sent[2]["content"].startswith("Error: tool call 1 (python)")


def test_hermes_text_tool_calls_are_parsed_when_the_api_returns_none():
    text = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 3)"}}\n</tool_call>'
    with FakeServer([Reply(text=text), Reply(text="\\boxed{18}")], chat_only=True) as server:
        t = text_episode(server, tools="python")
    assert t.correct and t.messages[1]["tool_calls"][0]["id"] == "call_0_0"
    sent = server.requests[1]["messages"]
    assert sent[1]["content"] == text and sent[1]["tool_calls"][0]["id"] == "call_0_0"
    assert sent[2]["role"] == "tool" and sent[2]["tool_call_id"] == "call_0_0"


def test_native_tool_call_checks():
    calls, errors = check_native_tool_calls([
        native("bash", {"command": "ls"}, "id1"),
        {"id": "id2", "type": "function", "function": {"name": "submit", "arguments": ""}},
        {"type": "function", "function": {"name": "editor", "arguments": {"command": "view", "path": "."}}},
        native("bash", "[1, 2]", "id4"),
        {"id": "id5", "type": "function", "function": {"arguments": "{}"}},
    ], turn=3)
    assert [c["id"] for c in calls] == ["id1", "id2", "call_3_2"]
    assert calls[1]["function"]["arguments"] == "{}" and json.loads(calls[2]["function"]["arguments"])["path"] == "."
    assert "must be a JSON object" in errors[0] and "no function name" in errors[1]


def test_api_messages_put_tool_answers_right_after_their_calls():
    call = native("bash", {"command": "ls"}, "c1")
    other = native("bash", {"command": "pwd"}, "c2")
    transcript = [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [call, other], "invalid_tool_calls": ["bad"]},
        {"role": "user", "content": "A tool call in your reply could not be parsed: bad."},  # the SWE env's order
        {"role": "tool", "tool_call_id": "c1", "content": "out", "name": "bash"},
        {"role": "tool", "content": "Error: something"},  # answers no call
    ]
    assert api_messages(transcript) == [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [call, other]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
        {"role": "tool", "tool_call_id": "c2", "content": NO_RESULT},
        {"role": "user", "content": "A tool call in your reply could not be parsed: bad."},
        {"role": "user", "content": "Error: something"},
    ]


def test_chat_client_sends_the_api_fields():
    async def go(server: FakeServer):
        client = OpenAIChatClient(server.base_url, "m", api_key="k", retry=FAST)
        try:
            return await client.chat([{"role": "user", "content": "hi"}], [{"type": "function", "function": {
                "name": "f", "parameters": {}}}], SamplingParams(max_tokens=5, temperature=0.5, top_p=0.9, seed=3))
        finally:
            await client.aclose()

    with FakeServer([Reply(text="hello world", weight_version="v2")], chat_only=True) as server:
        reply = asyncio.run(go(server))
    assert reply.text == "hello" and reply.finish_reason == "length" and reply.completion_tokens == 5
    assert reply.weight_version == "v2"
    (req,) = server.requests
    assert req == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                   "temperature": 0.5, "top_p": 0.9, "seed": 3, "tool_choice": "auto",
                   "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}


# -- choosing the mode ----------------------------------------------------------------------------


def test_probe_picks_chat_when_no_token_ids_come_back():
    with FakeServer(chat_only=True) as server:
        choice = probe_mode(server.base_url, "fake", retry=FAST)
        assert choice.mode == "chat" and "404" in choice.reason and server.requests == []
    with FakeServer([Reply(text="x", omit=("token_ids",))]) as server:
        assert probe_mode(server.base_url, "fake", retry=FAST).mode == "chat"
    with FakeServer([Reply(text="x", omit=("logprobs",))]) as server:
        assert "log-probs" in probe_mode(server.base_url, "fake", retry=FAST).reason
    with FakeServer([Reply(status=503), Reply(text="x")]) as server:
        choice = probe_mode(server.base_url, "fake", retry=FAST)
        assert choice.mode == "tokens" and len(server.requests) == 2
        assert server.requests[0]["prompt"] == "Hello" and server.requests[0]["return_token_ids"] is True
    with FakeServer(responder=lambda req, prompt: Reply(status=500)) as server:
        with pytest.raises(EngineUnavailableError, match="cannot probe"):
            probe_mode(server.base_url, "fake", retry=FAST)


@pytest.fixture
def no_tokenizer(monkeypatch):
    """Any tokenizer lookup or download fails the test."""
    import transformers

    import sao.agents.models.prepare as model

    def refuse(*args, **kwargs):
        raise AssertionError(f"a tokenizer was looked up: {args}")

    monkeypatch.setattr(model, "ensure_model", refuse)
    monkeypatch.setattr(model, "resolve_model", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


def test_open_endpoint_in_chat_mode_resolves_no_tokenizer(no_tokenizer):
    with FakeServer(chat_only=True) as server:
        with open_endpoint("org/hosted-model", base_url=server.base_url, mode="auto") as endpoint:
            assert endpoint.mode == "chat" and endpoint.tokenizer is None
        with open_endpoint("org/hosted-model", base_url=server.base_url, mode="chat") as endpoint:
            assert endpoint.mode == "chat" and endpoint.tokenizer is None
    with pytest.raises(ValueError, match="external endpoints"):
        with open_endpoint("smollm2-135m", mode="chat"):
            pass


def test_open_endpoint_auto_keeps_tokens_mode_for_a_token_server():
    with FakeServer([Reply(text="x")]) as server:
        with open_endpoint("some-org/some-model", base_url=server.base_url, mode="auto") as endpoint:
            assert endpoint.mode == "tokens" and endpoint.tokenizer == "some-org/some-model"


# -- sao-eval in chat mode ------------------------------------------------------------------------


def eval_cfg(tmp_path: Path, server: FakeServer, **kw) -> EvalConfig:
    base = dict(benchmark="arithmetic", output=tmp_path / "out", base_url=server.base_url, model="org/hosted-model",
                limit=4, samples=2, concurrency=2, max_tokens=64, max_turns=4, timeout_s=10.0)
    return EvalConfig(**{**base, **kw})


def test_eval_arithmetic_chat_mode_pass_at_k_without_a_tokenizer(tmp_path, no_tokenizer):
    with FakeServer(responder=solver, chat_only=True) as server:
        summary = evaluate(eval_cfg(tmp_path, server))
    assert summary["infra_errors"] == 0 and summary["n_episodes"] == 8 and summary["mode"] == "text"
    assert set(summary["pass@k"]) == {"1", "2"} and summary["pass@k"]["2"] >= summary["pass@1"] > 0
    assert summary["tokens_generated"] > 0 and summary["turns_without_usage"] == 0
    trajectories = read_trajectories(tmp_path / "out" / "trajectories.jsonl")
    assert all(t.mode == "text" and not t.trainable and t.info["answer"] is not None for t in trajectories)
    assert all("messages" in r for r in server.requests)  # every request went to the chat route


def test_eval_chat_mode_resume_reruns_only_the_failed_episodes(tmp_path):
    def broken(request: dict, prompt: str) -> Reply:  # rejects the tasks with an odd answer (not retried)
        return Reply(status=400, error="rejected") if arithmetic_answer(prompt) % 2 else solver(request, prompt)

    with FakeServer(responder=broken, chat_only=True) as server:
        first = evaluate(eval_cfg(tmp_path, server, samples=1, endpoint_mode="chat"))
    odd = sum(arithmetic_answer(t.messages[0]["content"]) % 2
              for t in read_trajectories(tmp_path / "out" / "trajectories.jsonl"))
    assert first["mode"] == "text" and first["n_failed"] == first["infra_errors"] == odd >= 1
    with FakeServer(responder=solver, chat_only=True) as server:
        second = evaluate(eval_cfg(tmp_path, server, samples=1, endpoint_mode="chat", resume=True))
        assert len(server.requests) == odd  # only the failed pairs ran again, one request each
    assert second["infra_errors"] == 0 and second["n_episodes"] == 4 and second["mode"] == "text"
    assert len(read_trajectories(tmp_path / "out" / "trajectories.jsonl")) == 4 + odd  # appended, nothing lost


def test_chat_mode_needs_a_base_url(tmp_path):
    with pytest.raises(EvalError, match="needs --base-url"):
        EvalConfig(benchmark="arithmetic", output=tmp_path, endpoint_mode="chat")


def answerbench_file(tmp_path: Path) -> Path:
    """The shared IMO-AnswerBench copy when present, else four rows in its schema."""
    shared = SHARED_DATA / "answerbench_v2.csv"
    if shared.exists():
        return shared
    path = tmp_path / "answerbench.csv"
    rows = [("imo-bench-algebra-001", "How many sides has a triangle?", "3"),
            ("imo-bench-algebra-002", "Simplify $2x + 3x$.", "$5x$"),
            ("imo-bench-algebra-003", "What is $2^{10}$?", "1024"),
            ("imo-bench-algebra-004", "Give $\\frac{2}{4}$ in lowest terms.", "$\\frac{1}{2}$")]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Problem ID", "Problem", "Short Answer", "Category", "Subcategory", "Source"])
        w.writerows((i, p, a, "Algebra", "x", "test") for i, p, a in rows)
    return path


def answerbench_solver(path: Path):
    """Answers each problem with its reference answer in ``\\boxed{}``."""
    with path.open(newline="") as fh:
        answers = {r["Problem"].strip(): r["Short Answer"].strip() for r in csv.DictReader(fh)}

    def respond(request: dict, prompt: str) -> Reply:
        answer = next(a for p, a in answers.items() if p in prompt)
        return Reply(text=f"So the answer is \\boxed{{{answer.strip('$. ')}}}.", usage=False)

    return respond


def test_contract_sao_eval_imo_answerbench_against_a_chat_only_endpoint(tmp_path):
    """`sao-eval imo-answerbench --data FILE --base-url URL --model M` grades every answer, with no infra
    error and no tokenizer lookup (the model name is no alias and no local directory; the hub is offline)."""
    data, out, hf_home = answerbench_file(tmp_path), tmp_path / "out", tmp_path / "hf"
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with FakeServer(responder=answerbench_solver(data), chat_only=True) as server:
        proc = subprocess.run([SAO_EVAL, "imo-answerbench", "--data", str(data), "--base-url", server.base_url,
                               "--model", "some-provider/hosted-chat-model", "--limit", "4", "--output", str(out)],
                              capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "text mode" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["infra_errors"] == 0 and summary["n_episodes"] == 4 and summary["mode"] == "text"
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert len(trajectories) == 4
    for t in trajectories:  # graded: an extracted answer, a grading method, no error
        assert t.status == "ok" and t.info["answer"] is not None and t.info["graded_by"] and t.info["error"] is None
    assert summary["resolved"] >= 1  # the integer answer at least
    assert not hf_home.exists() or not any(hf_home.rglob("*tokenizer*"))


# -- SWE in chat mode (real Docker, real grading) -------------------------------------------------


def swe_gold_responder(patches: dict[str, str]):
    """Native tool calls, one per turn: write the gold patch, apply it, submit."""

    def respond(request: dict, prompt: str) -> Reply:
        messages = request["messages"]
        repo = re.search(r"\(repository ([^)]+)\)", prompt).group(1)  # type: ignore[union-attr]
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn:  # the API's rule: each call is answered right after the assistant message
            last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            ids = [c["id"] for c in messages[last]["tool_calls"]]
            assert [m.get("tool_call_id") for m in messages[last + 1:last + 1 + len(ids)]] == ids
        steps = [("editor", {"command": "create", "path": "/tmp/gold.patch", "file_text": patches[repo]}),
                 ("bash", {"command": "git apply /tmp/gold.patch && rm /tmp/gold.patch"}), ("submit", {})]
        name, args = steps[min(turn, 2)]
        return Reply(text="" if turn else "Applying the fix.", tool_calls=(native(name, args, f"toolu_{turn}"),))

    return respond


@pytest.mark.docker
def test_sao_eval_swe_local_chat_mode_with_native_tool_calls(docker_client, tmp_path):
    env = E.make("swe-local")
    try:
        ids = env.unwrapped.task_ids(2)
        patches = {env.unwrapped.get(i).repo: env.unwrapped.get(i).patch for i in ids}
    finally:
        env.close()
    out = tmp_path / "swe"
    with FakeServer(responder=swe_gold_responder(patches), chat_only=True) as server:
        proc = subprocess.run([SAO_EVAL, "swe-local", "--limit", "2", "--concurrency", "2", "--base-url",
                               server.base_url, "--model", "hosted", "--max-tokens", "100000", "--output", str(out)],
                              capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["infra_errors"] == 0 and summary["resolved"] == 2 and summary["mode"] == "text"
    for t in read_trajectories(out / "trajectories.jsonl"):
        assert t.info["exit_status"] == "submitted" and t.correct and t.mode == "text"
        tool_ids = [m["tool_call_id"] for m in t.messages if m["role"] == "tool"]
        assert tool_ids == ["toolu_0", "toolu_1", "toolu_2"]  # the API's ids, kept
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2 and all(p["model_patch"] and p["model_name_or_path"] == "hosted" for p in predictions)


def test_tokens_mode_without_a_tokenizer_says_what_to_pass(tmp_path, monkeypatch):
    import transformers

    def missing(name, *args, **kwargs):
        raise OSError(f"{name} is not a local folder and is not a valid model identifier")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", missing)
    with FakeServer(chat_only=True) as server:
        with pytest.raises(EvalError, match="--endpoint-mode chat"):
            evaluate(eval_cfg(tmp_path, server, endpoint_mode="tokens", model="org/no-such-model"))


def test_fake_chat_answers_parse_as_the_openai_sdks_chat_completion():
    """The fake speaks the real schema: its answers validate as ``openai.types.chat.ChatCompletion``."""
    from openai.types.chat import ChatCompletion as SDKChatCompletion

    calls = (native("bash", {"command": "ls"}, "call_1"),)
    with FakeServer([Reply(tool_calls=calls), Reply(text="hi", usage=False)], chat_only=True) as server:
        for _ in range(2):
            r = httpx.post(server.base_url + "/chat/completions", timeout=10,
                           json={"model": "fake", "messages": [{"role": "user", "content": "x"}], "max_tokens": 8})
            parsed = SDKChatCompletion.model_validate(r.json())
            ours = parse_chat_completion(r.json())
            assert ours.text == (parsed.choices[0].message.content or "")
            assert ours.finish_reason == parsed.choices[0].finish_reason
    assert ours.completion_tokens is None and parsed.usage is None
