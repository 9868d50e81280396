"""Per-token policy versions (issue 11): vLLM's token route and its ``weight_versions`` spans, the runs a
turn records, and what staleness reads from them. A scripted server here; the real engine's spans are
checked in tests/test_vllm_integration.py."""

from __future__ import annotations

import asyncio

import pytest

from sao.agents import ByteTokenizer, ChatRenderer, LoopConfig, RetryPolicy, Trajectory, TurnRecord, VersionSpan
from sao.agents.clients.completions import SamplingParams
from sao.agents.clients.generate import GenerateClient, generate_base_url, parse_generate, version_runs
from sao.agents.errors import ContextOverflowError, EngineResponseError
from sao.agents.loop.token_loop import run_episode
from sao.agents.records import Completion
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.rl.rollout.versioned_client import runs_within, turn_versions

FAST = RetryPolicy(max_retries=0)


def test_spans_become_runs_clamped_merged_or_none():
    spans = [{"version": "3", "start": 0, "end": 16}, {"version": "4", "start": 16, "end": 200}]
    assert version_runs(spans, 200) == ((3, 16), (4, 184))
    assert version_runs(spans, 150) == ((3, 16), (4, 134))  # a stop string trimmed the last span
    assert version_runs(spans, 10) == ((3, 10),)  # ... down into the first: the empty one is dropped
    assert version_runs([{"version": "5", "start": 0, "end": 3}, {"version": "5", "start": 3, "end": 7}], 7) == ((5, 7),)
    assert version_runs([{"version": "default", "start": 0, "end": 4}], 4) is None  # never labelled
    assert version_runs([{"version": "3", "start": 0, "end": 3}, {"version": "4", "start": 5, "end": 7}], 7) is None
    assert version_runs([{"version": "3", "start": 0, "end": 3}], 7) is None  # does not cover the tokens
    assert version_runs([], 3) is None and version_runs(None, 3) is None and version_runs(spans, 0) is None
    assert version_runs([{"start": 0, "end": 3}], 3) is None


def test_records_check_their_runs_and_read_back_from_json():
    with pytest.raises(ValueError, match="do not cover 3 tokens"):
        Completion((1, 2, 3), (0.0,) * 3, "", "stop", token_versions=((1, 2),))
    with pytest.raises(ValueError, match="at least one"):
        TurnRecord(0, 2, "stop", None, 0.0, 1.0, token_versions=((1, 2), (2, 0)))
    turn = TurnRecord(2, 3, "stop", "4", 0.0, 1.0, policy_versions=VersionSpan(3, 4), token_versions=[[3, 1], [4, 2]])
    assert turn.token_versions == ((3, 1), (4, 2)) and turn.versions == (3, 4)
    assert TurnRecord(2, 3, "stop", None, 0.0, 1.0, policy_versions=VersionSpan(3, 4)).versions == (3, 4)
    assert TurnRecord(2, 3, "stop", None, 0.0, 1.0, policy_versions=VersionSpan(4, 4)).versions == (4,)
    # a request sent at 3 whose every token came from 4: the runs say 4 only (the span alone said 3-4)
    assert TurnRecord(2, 3, "stop", None, 0.0, 1.0, policy_versions=VersionSpan(3, 4),
                      token_versions=((4, 3),)).versions == (4,)
    t = Trajectory("e", "env", "t", 0, None, (1, 2, 7, 8, 9), (0, 0, 1, 1, 1), (0.0, 0.0, -1.0, -1.0, -1.0),
                   (turn,), (), 1.0, True, False, "ok")
    back = Trajectory.from_json(t.to_json())
    assert back == t and back.turns[0].token_versions == ((3, 1), (4, 2))
    assert turn_versions(back, 9) == (3, 4)


def test_the_token_route_client_parses_versions_and_the_loop_records_them():
    spans = (("3", 0, 2), ("4", 2, 8))
    with FakeServer(script=[Reply(text="The answer is 4", version_spans=spans), Reply(text="[Done]")]) as server:
        async def go():  # type: ignore[no-untyped-def]
            client = GenerateClient(generate_base_url(server.root_url), "fake", retry=FAST)
            try:
                done = await client.complete([1, 2, 3], SamplingParams(max_tokens=8, temperature=1.0, seed=5))
                from sao.envs import make

                env = make("arithmetic", seed=0, difficulty=0.0, ops="+")
                episode = await run_episode(env, client, ChatRenderer(ByteTokenizer()),
                                            LoopConfig(max_turns=1, max_tokens=16), env_name="arithmetic",
                                            task_id=env.unwrapped.task_ids(1)[0])
                return done, episode
            finally:
                await client.aclose()

        done, episode = asyncio.run(go())
        sent = server.requests[0]
    assert sent["token_ids"] == [1, 2, 3] and sent["sampling_params"]["seed"] == 5
    assert sent["sampling_params"]["logprobs"] == 0 and sent["return_token_ids"] is True
    assert len(done.token_ids) == 8 and done.finish_reason == "length"
    assert done.token_versions == ((3, 2), (4, 6)) and done.weight_version == "4"
    assert done.logprobs == (-0.5,) * len(done.token_ids)
    turn = episode.turns[0]
    assert turn.token_versions is None  # the second reply's span is labelled "default": no versions


def test_a_malformed_token_route_answer_is_an_engine_response_error():
    good = {"choices": [{"token_ids": [5, 6], "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]},
                         "weight_versions": [{"version": "1", "start": 0, "end": 2}], "finish_reason": "stop"}]}
    assert parse_generate(good).token_versions == ((1, 2),)
    for bad, match in (({"choices": []}, "no choices"),
                       ({"choices": [{"logprobs": {"content": []}}]}, "no `token_ids`"),
                       ({"choices": [{"token_ids": [5, 6], "logprobs": {"content": [{"logprob": -1.0}]}}]}, "expected 2"),
                       ({"choices": [{"token_ids": [5], "logprobs": {"content": [{"logprob": -9999.0}]}}]}, "missing")):
        with pytest.raises(EngineResponseError, match=match):
            parse_generate(bad)


def test_the_versioned_client_keeps_runs_within_its_span_and_fills_untouched_turns():
    c = Completion((1, 2, 3, 4), (0.0,) * 4, "", "stop", token_versions=((3, 1), (4, 3)))
    assert runs_within(c, VersionSpan(3, 4)) == ((3, 1), (4, 3))
    assert runs_within(c, VersionSpan(5, 5)) == ((5, 4),)  # runs the replica never loaded: its own version
    assert runs_within(c, VersionSpan(2, 3)) is None  # outside a span a sync landed in: unknown
    plain = Completion((1, 2), (0.0, 0.0), "", "stop")  # /v1/completions: no runs
    assert runs_within(plain, VersionSpan(7, 7)) == ((7, 2),) and runs_within(plain, VersionSpan(7, 8)) is None
    assert runs_within(Completion((), (), "", "stop"), VersionSpan(7, 7)) is None


def _preemptions(root_url: str) -> float:
    import httpx

    text = httpx.get(f"{root_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_preemptions_total"))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.part("vllm-token-route")
def test_a_weight_update_mid_request_splits_its_tokens_versions_on_the_real_engine(restore_engine):
    """The session's vLLM (served with the token route): the project's client gets whole-number runs from
    it, and a prompt over the context is a ContextOverflowError as on ``/v1/completions``; a long request
    across two pauses in "keep" mode that relabel 3 -> 4 -> 5 (the sync's sequence, without the reload)
    comes back as three runs covering its tokens. The first pause clears the cache (the default), so
    vLLM preempted the request to compute its context again; the second keeps its KV blocks (no
    preemption: ``load_weights(keep_kv=True)``)."""
    import httpx

    from sao.agents.engine.control import EngineClient

    server = restore_engine
    prompt = list(range(300, 340))

    async def go():  # type: ignore[no-untyped-def]
        async with EngineClient(server.root_url) as engine:
            await engine.set_weight_version(3)
            client = GenerateClient(generate_base_url(server.root_url), server.model_name)
            try:
                short = await client.complete(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=1))
                with pytest.raises(ContextOverflowError):  # as on /v1/completions: the loop ends the episode truncated
                    await client.complete(list(range(300, 2400)), SamplingParams(max_tokens=8))
            finally:
                await client.aclose()
            body = {"model": server.model_name, "token_ids": prompt, "output_mode": "text", "return_token_ids": True,
                    "sampling_params": {"max_tokens": 400, "temperature": 1.0, "logprobs": 0, "ignore_eos": True}}
            async with httpx.AsyncClient(base_url=generate_base_url(server.root_url), timeout=600) as http:
                before = _preemptions(server.root_url)
                long = asyncio.create_task(http.post("/generate", json=body))
                await asyncio.sleep(1.0)  # 400 tokens take several seconds on 2 cores: this lands mid-way
                assert not long.done()
                await engine.pause(mode="keep")  # clear_cache: vLLM preempts it, to compute its context again
                try:
                    await engine.set_weight_version(4)
                finally:
                    await engine.resume()
                await asyncio.sleep(1.0)  # the counter moves with the steps after the resume
                recomputed = _preemptions(server.root_url) - before
                assert not long.done()
                await engine.pause(mode="keep", clear_cache=False)  # keeps its KV blocks: no preemption
                try:
                    await engine.set_weight_version(5)
                finally:
                    await engine.resume()
                answer = await long
                answer.raise_for_status()
                kept = _preemptions(server.root_url) - before - recomputed
                return short, parse_generate(answer.json()), recomputed, kept

    short, split, recomputed, kept = asyncio.run(go())
    print(f"\nshort: {short.token_versions}; across the updates: {split.token_versions}, preemptions +{recomputed:.0f} "
          f"(cleared), +{kept:.0f} (kept)")
    assert short.token_versions == ((3, len(short.token_ids)),) and short.weight_version == "3"
    assert len(split.token_ids) == 400 and split.finish_reason == "length"
    (v0, n0), (v1, n1), (v2, n2) = split.token_versions  # type: ignore[misc]
    assert (v0, v1, v2) == (3, 4, 5) and n0 > 0 and n1 > 0 and n2 > 0 and n0 + n1 + n2 == 400
    assert recomputed == 1 and kept == 0


def test_a_batchs_version_metrics_count_token_staleness_splits_and_the_recompute():
    from sao.rl.rollout.versioned_client import version_metrics

    def trajectory(*turns: TurnRecord) -> Trajectory:
        n = turns[-1].prompt_len + turns[-1].completion_len
        return Trajectory("e", "env", "t", 0, None, (1,) * n, (0,) * n, (0.0,) * n, turns, (), 0.0, True, False, "ok")

    split = TurnRecord(10, 6, "stop", None, 0.0, 1.0, token_versions=((3, 2), (4, 4)))  # landed after 2 tokens
    whole = TurnRecord(20, 4, "stop", None, 0.0, 1.0, token_versions=((4, 4),))
    unknown = TurnRecord(30, 5, "stop", None, 0.0, 1.0)
    m = version_metrics([trajectory(split, whole), trajectory(unknown)], step=5)
    # tokens: 2 at staleness 2, 8 at staleness 1 -> 12 / 10; one split turn, re-prefilled 10 + 2 tokens
    assert m == {"rollout/token_staleness_mean": pytest.approx(1.2), "rollout/split_turns": 1.0,
                 "rollout/reprefill_tokens": 12.0}
    assert version_metrics([trajectory(unknown)], step=5) == {}
