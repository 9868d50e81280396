"""The agent loop against the scripted OpenAI-compatible fake server (real HTTP on localhost)."""

from __future__ import annotations

import asyncio
import time

import pytest

import sao.envs as E
from sao.agents import (
    ByteTokenizer,
    ChatRenderer,
    ContextOverflowError,
    EngineResponseError,
    EngineUnavailableError,
    LoopConfig,
    OpenAICompletionClient,
    RetryPolicy,
    SamplingParams,
    Trajectory,
    run_episode,
)
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.envs.arithmetic import make_task

FAST = RetryPolicy(max_retries=3, backoff_s=0.01, max_backoff_s=0.02)
TASK = "mul-d1-s0-i0"
GOLD = make_task("mul", 1, 0, 0).answer


def episode(server, *, cfg=LoopConfig(max_tokens=256), feedback_turns=0, timeout_s=5.0, retry=FAST) -> Trajectory:
    async def go():
        client = OpenAICompletionClient(server.base_url, "fake", timeout_s=timeout_s, retry=retry)
        try:
            env = E.make("arithmetic", feedback_turns=feedback_turns)
            return await run_episode(env, client, ChatRenderer(ByteTokenizer()), cfg, env_name="arithmetic",
                                     task_id=TASK, seed=7)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_correct_single_turn_episode_records_tokens_and_logprobs():
    with FakeServer([Reply(text=f"\\boxed{{{GOLD}}}", logprob=-0.25)]) as server:
        t = episode(server)
    assert t.status == "ok" and t.terminated and not t.truncated and t.reward == 1.0 and t.correct
    tok = ByteTokenizer()
    completion = tok.encode(f"\\boxed{{{GOLD}}}") + [tok.eos_token_id]
    assert list(t.token_ids[-len(completion):]) == completion
    assert t.action_mask.count(1) == len(completion) and t.action_mask[-len(completion):] == (1,) * len(completion)
    assert t.logprobs[-len(completion):] == (-0.25,) * len(completion)
    assert set(t.logprobs[:-len(completion)]) == {0.0}
    assert server.requests[0]["prompt"] == list(t.token_ids[:t.turns[0].prompt_len])
    assert server.requests[0]["seed"] == 7000  # seed * 1000 + turn


def test_multi_turn_tokens_equal_last_prompt_plus_completion():
    with FakeServer([Reply(text="maybe 3"), Reply(text="hmm"), Reply(text=f"\\boxed{{{GOLD}}}")]) as server:
        t = episode(server, feedback_turns=3)
    assert t.status == "ok" and t.correct and len(t.turns) == 3
    last_prompt = server.requests[-1]["prompt"]
    assert list(t.token_ids[:len(last_prompt)]) == last_prompt
    assert len(t.token_ids) == len(last_prompt) + t.turns[-1].completion_len
    # Each turn's prompt extends the previous one: the sequence only grows.
    for a, b in zip(server.requests, server.requests[1:]):
        assert b["prompt"][:len(a["prompt"])] == a["prompt"]
    # The observation between turns is the env's feedback, rendered by the template.
    text = ByteTokenizer().decode(t.token_ids)
    assert "<|im_end|>\n<|im_start|>user\nYour answer 3 is not correct." in text
    assert [m["role"] for m in t.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]


def test_retries_connection_errors_and_5xx_then_succeeds():
    script = [Reply(status=500), Reply(drop=True), Reply(status=503), Reply(text=f"\\boxed{{{GOLD}}}")]
    with FakeServer(script) as server:
        t = episode(server)
    assert t.status == "ok" and t.correct
    assert len(server.requests) == 4 and t.turns[0].attempts == 4


def test_attempts_count_only_this_requests_retries_when_episodes_share_a_client():
    # Two episodes on one client at once: seed 7's request is slow and answered first time; seed 8's
    # fails twice (503) while the other is in flight, then is answered. Each turn records its own
    # HTTP attempts: 1 and 3 (a client-wide counter's difference gave the slow one 1 + 3 = 4).
    failures = {"left": 2}

    def respond(request, _prompt):
        if request["seed"] == 8000 and failures["left"]:
            failures["left"] -= 1
            return Reply(status=503)
        return Reply(text=f"\\boxed{{{GOLD}}}", delay_s=0.5 if request["seed"] == 7000 else 0.0)

    async def go():
        client = OpenAICompletionClient(server.base_url, "fake", timeout_s=5.0, retry=FAST)
        try:
            def one(seed: int):
                return run_episode(E.make("arithmetic"), client, ChatRenderer(ByteTokenizer()), LoopConfig(max_tokens=256),
                                   env_name="arithmetic", task_id=TASK, seed=seed)
            return await asyncio.gather(one(7), one(8))
        finally:
            await client.aclose()

    with FakeServer(responder=respond) as server:
        slow, retried = asyncio.run(go())
    assert slow.correct and retried.correct and len(server.requests) == 4
    assert (slow.turns[0].attempts, retried.turns[0].attempts) == (1, 3)


def test_retries_spent_is_a_recorded_failure_not_a_crash():
    with FakeServer([Reply(status=502)] * 10) as server:
        t = episode(server)
    assert t.status == "failed" and "EngineUnavailableError" in t.error and "4 attempts" in t.error
    assert len(server.requests) == 4  # 1 + max_retries
    assert t.info["correct"] is False and t.token_ids  # the prompt tokens are kept


def test_per_request_timeout_is_retried():
    # a 6 s answer against a 0.5 s timeout: wide margins, so a loaded machine cannot fail it
    with FakeServer([Reply(text="late", delay_s=6.0), Reply(text=f"\\boxed{{{GOLD}}}")]) as server:
        t0 = time.monotonic()
        t = episode(server, timeout_s=0.5)
        elapsed = time.monotonic() - t0
    assert t.status == "ok" and t.correct and len(server.requests) == 2
    assert elapsed < 5.0  # the slow answer was not waited for


@pytest.mark.parametrize("reply, match", [
    (Reply(raw=b"{this is not json"), "malformed"),
    (Reply(text="x", omit=("token_ids",)), "token_ids"),
    (Reply(text="x", omit=("logprobs",)), "log-probs"),
    (Reply(raw=b'{"choices": []}'), "no choices"),
])
def test_malformed_response_fails_the_episode_with_its_cause(reply, match):
    with FakeServer([reply, Reply(text="never reached")]) as server:
        t = episode(server)
    assert t.status == "failed" and "EngineResponseError" in t.error and match in t.error
    assert len(server.requests) == 1  # not retried


def test_context_overflow_from_the_server_truncates():
    overflow = Reply(status=400, error="This model's maximum context length is 4096 tokens. However, you requested 5000")
    with FakeServer([Reply(text="hmm"), overflow]) as server:
        t = episode(server, feedback_turns=2)
    assert t.status == "ok" and t.truncated and not t.terminated
    assert t.info["truncated_by"] == "context" and t.info["correct"] is False


def test_prompt_longer_than_context_truncates_without_a_request():
    with FakeServer() as server:
        t = episode(server, cfg=LoopConfig(max_model_len=10))
    assert t.truncated and t.info["truncated_by"] == "context" and server.requests == []


def test_token_budget_and_turn_limit():
    with FakeServer(responder=lambda req, prompt: Reply(text="x" * 40)) as server:
        t = episode(server, cfg=LoopConfig(max_tokens=60, max_turns=8), feedback_turns=10)
    assert t.truncated and t.info["truncated_by"] == "max_tokens"
    assert t.num_action_tokens == 60  # 41 + 19: the second turn got only what was left
    assert server.requests[1]["max_tokens"] == 19
    with FakeServer(responder=lambda req, prompt: Reply(text="no")) as server:
        t = episode(server, cfg=LoopConfig(max_tokens=1000, max_turns=3), feedback_turns=10)
    assert t.truncated and t.info["truncated_by"] == "max_turns" and len(t.turns) == 3


def test_length_finish_closes_the_turn_with_observation_tokens():
    # A turn cut by max_tokens has no end-of-turn token; the bridge supplies it as an observation token.
    with FakeServer([Reply(text="long answer", finish_reason="length", end_with_eos=False),
                     Reply(text=f"\\boxed{{{GOLD}}}")]) as server:
        t = episode(server, feedback_turns=1)
    tok = ByteTokenizer()
    start = t.turns[0].prompt_len + t.turns[0].completion_len
    assert t.token_ids[start] == tok.eos_token_id and t.action_mask[start] == 0


def test_context_overflow_error_raised_by_client():
    overflow = Reply(status=400, error="maximum context length exceeded")

    async def go(server):
        client = OpenAICompletionClient(server.base_url, "fake", retry=FAST)
        try:
            await client.complete([1, 2, 3], SamplingParams(max_tokens=4))
        finally:
            await client.aclose()

    with FakeServer([overflow]) as server, pytest.raises(ContextOverflowError):
        asyncio.run(go(server))
    with FakeServer([Reply(raw=b"<html>")]) as server, pytest.raises(EngineResponseError):
        asyncio.run(go(server))
    with FakeServer([Reply(status=503)] * 5) as server, pytest.raises(EngineUnavailableError):
        asyncio.run(go(server))


def test_trajectory_json_round_trip():
    with FakeServer([Reply(text=f"\\boxed{{{GOLD}}}")]) as server:
        t = episode(server)
    assert Trajectory.from_json(t.to_json()) == t


def test_env_exception_is_recorded():
    class Exploding(E.TextEnv):
        def task_ids(self, limit=None):
            return ["t"]

        def _begin(self, task_id):
            return [{"role": "user", "content": "go"}], {"task_id": "t"}

        def _respond(self, action):
            raise OSError("disk on fire")

    async def go(server):
        client = OpenAICompletionClient(server.base_url, "fake", retry=FAST)
        try:
            return await run_episode(Exploding(), client, ChatRenderer(ByteTokenizer()), LoopConfig(),
                                     env_name="x", task_id="t")
        finally:
            await client.aclose()

    with FakeServer() as server:
        t = asyncio.run(go(server))
    assert t.status == "failed" and "disk on fire" in t.error and t.num_action_tokens > 0


def test_max_tokens_per_turn_caps_each_request_within_the_trajectory_budget():
    with FakeServer([Reply(text="maybe 3"), Reply(text="hmm"), Reply(text=f"\\boxed{{{GOLD}}}")]) as server:
        t = episode(server, cfg=LoopConfig(max_tokens=256, max_tokens_per_turn=40), feedback_turns=2)
    assert t.status == "ok" and len(server.requests) == 3
    assert [r["max_tokens"] for r in server.requests] == [40, 40, 40]
    with FakeServer([Reply(text=f"\\boxed{{{GOLD}}}")]) as server:
        episode(server, cfg=LoopConfig(max_tokens=30, max_tokens_per_turn=40))
    assert server.requests[0]["max_tokens"] == 30  # never past what the trajectory has left


# -- an answer cut by a token limit (issue 14): graded by the environment, recorded truncated ---------------


def test_answer_cut_by_the_token_budget_is_graded_and_recorded_truncated():
    # The engine stopped at max_tokens ("length") after a right answer: the environment grades it and ends the
    # episode (terminated: its reward is final), and a limit cut the answer (truncated): both flags.
    cut = Reply(text=f"\\boxed{{{GOLD}}} because", finish_reason="length", end_with_eos=False)
    with FakeServer([cut]) as server:
        t = episode(server)
    assert t.status == "ok" and t.truncated and t.terminated and t.info["truncated_by"] == "max_tokens"
    assert t.correct and t.reward == 1.0 and t.info["answer"] == str(GOLD) and t.info["error"] is None
    with FakeServer([Reply(text="\\boxed{-1} but", finish_reason="length", end_with_eos=False)]) as server:
        wrong = episode(server)
    assert wrong.truncated and wrong.terminated and not wrong.correct and wrong.reward == 0.0
    assert Trajectory.from_json(t.to_json()) == t


def test_answer_cut_by_the_per_turn_cap_or_the_context_names_that_limit():
    cut = Reply(text=f"\\boxed{{{GOLD}}}", finish_reason="length", end_with_eos=False)
    with FakeServer([cut]) as server:
        t = episode(server, cfg=LoopConfig(max_tokens=256, max_tokens_per_turn=40))
    assert t.truncated and t.terminated and t.info["truncated_by"] == "max_tokens_per_turn" and t.correct
    with FakeServer([Reply(text="x"), cut]) as server:
        prompt_len = episode(server).turns[0].prompt_len  # a first run, to size the context below
        t = episode(server, cfg=LoopConfig(max_tokens=256, max_model_len=prompt_len + 20))
    assert server.requests[-1]["max_tokens"] == 20
    assert t.truncated and t.terminated and t.info["truncated_by"] == "context" and t.correct


def test_the_smallest_room_names_the_limit_and_the_budget_wins_a_tie():
    from sao.agents.loop.skeleton import length_cut

    assert length_cut(LoopConfig(max_tokens=100), budget_left=100, context_left=100) == "max_tokens"
    assert length_cut(LoopConfig(max_tokens=100, max_tokens_per_turn=30), budget_left=70, context_left=500) \
        == "max_tokens_per_turn"
    assert length_cut(LoopConfig(max_tokens=100, max_tokens_per_turn=30), budget_left=20, context_left=500) \
        == "max_tokens"
    assert length_cut(LoopConfig(max_tokens=100), budget_left=100, context_left=12) == "context"
    assert length_cut(LoopConfig(max_tokens=100), budget_left=40) == "max_tokens"  # text mode: no context known


def test_text_loop_records_a_cut_answer_as_truncated_too():
    from sao.agents import OpenAIChatClient, run_text_episode

    async def go(server, cfg):
        client = OpenAIChatClient(server.base_url, "fake", timeout_s=5.0, retry=FAST)
        try:
            return await run_text_episode(E.make("arithmetic"), client, cfg, env_name="arithmetic", task_id=TASK,
                                          seed=7)
        finally:
            await client.aclose()

    with FakeServer([Reply(text=f"\\boxed{{{GOLD}}}", finish_reason="length")], chat_only=True) as server:
        t = asyncio.run(go(server, LoopConfig(max_tokens=64)))
    assert t.mode == "text" and t.truncated and t.terminated and t.info["truncated_by"] == "max_tokens"
    assert t.correct and t.reward == 1.0
    with FakeServer([Reply(text=f"\\boxed{{{GOLD}}}")], chat_only=True) as server:
        t = asyncio.run(go(server, LoopConfig(max_tokens=64, max_tokens_per_turn=16)))
    assert t.terminated and not t.truncated and "truncated_by" not in t.info  # ended by the model: terminated
