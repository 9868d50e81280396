"""The capture proxy (sao.agents.capture) in front of the scripted fake server: the unchanged openai SDK
(synchronous, in a thread, as an agent would run), tools and streaming, merging and splitting through the
wire, the sampling rules as forwarded, the errors, many sessions at once, and text mode."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from sao.agents.capture import (AgentSampling, CaptureProxy, PinnedSampling, ProjectToolParser, TextUpstream,
                                TokenUpstream)
from sao.agents.capture.sampling import SamplingRule
from sao.agents.chat import ByteTokenizer
from sao.agents.clients.chat import OpenAIChatClient
from sao.agents.clients.completions import RetryPolicy
from sao.agents.clients.generate import GenerateClient, generate_base_url
from sao.agents.loop.episodes import Renderers
from sao.agents.testing.fake_server import FakeServer, Reply

FAST = RetryPolicy(max_retries=0)
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                          "b": {"type": "integer"}}}}}]
CALL_TEXT = 'Let me add. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
TRAIN = PinnedSampling(temperature=1.0, max_tokens=400)


def token_upstream(fake: FakeServer, max_model_len: int | None = None) -> TokenUpstream:
    return TokenUpstream(GenerateClient(generate_base_url(fake.root_url), "fake", retry=FAST),
                         Renderers(ByteTokenizer()), ProjectToolParser(), "fake", max_model_len=max_model_len)


def serve(fake: FakeServer, agent: Callable[[Any], Any], rule: SamplingRule = TRAIN,
          upstream: Any = None) -> tuple[Any, Any]:
    """Run ``agent(session)`` (synchronous, in a thread) against one proxy session; (its result, the session)."""

    async def go() -> tuple[Any, Any]:
        async with CaptureProxy() as proxy:
            with proxy.session(upstream or token_upstream(fake), rule) as session:
                return await asyncio.to_thread(agent, session), session

    return asyncio.run(go())


def sdk(session: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)


def engine_saw(fake: FakeServer, i: int) -> list[int]:
    return fake.requests[i]["token_ids"]


def test_the_openai_sdk_calls_a_tool_then_streams_and_the_two_calls_merge():
    def agent(session: Any) -> Any:
        client = sdk(session)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 1 + 2?"}]
        first = client.chat.completions.create(model=session.model, messages=messages, tools=TOOLS)
        message = first.choices[0].message
        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "3"}]
        stream = client.chat.completions.create(model=session.model, messages=messages, tools=TOOLS, stream=True)
        return first, "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with FakeServer([Reply(text=CALL_TEXT), Reply(text="It is 3.")]) as fake:
        (first, streamed), session = serve(fake, agent)
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.content == "Let me add. "
    (tool_call,) = first.choices[0].message.tool_calls
    assert (tool_call.function.name, json.loads(tool_call.function.arguments)) == ("add", {"a": 1, "b": 2})
    assert streamed == "It is 3."
    a = session.assemble()
    assert (a.stats.calls, a.stats.merged, a.stats.split) == (2, 1, 0)
    # the second prompt extends the first call's prompt and its SAMPLED ids (CALL_TEXT and the EOS)
    first_ids = engine_saw(fake, 0) + list(session.calls[0].completion.token_ids)
    assert engine_saw(fake, 1)[:len(first_ids)] == first_ids
    assert a.token_ids == tuple(engine_saw(fake, 1)) + session.calls[1].completion.token_ids
    assert sum(a.action_mask) == len(session.calls[0].completion.token_ids) + len(session.calls[1].completion.token_ids)


def test_an_agent_that_compacts_its_history_gets_a_second_segment_of_what_the_engine_saw():
    def agent(session: Any) -> None:
        client = sdk(session)
        messages = [{"role": "user", "content": "Count to three."}]
        reply = client.chat.completions.create(model=session.model, messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
        client.chat.completions.create(model=session.model, messages=messages)
        compacted = [{"role": "user", "content": "Summary: counted once. Count again."}]  # history rewritten
        client.chat.completions.create(model=session.model, messages=compacted)

    with FakeServer([Reply(text="1 2 3"), Reply(text="1 2 3 again"), Reply(text="1 2 3")]) as fake:
        _, session = serve(fake, agent)
    a = session.assemble()
    assert [s.reason for s in a.segments] == ["first", "prefix_changed"]
    assert a.stats.split_reasons == {"prefix_changed": 1} and a.stats.merged == 1
    for seg, last in zip(a.segments, (1, 2)):
        ids = a.token_ids[seg.start:seg.end]
        assert ids == tuple(engine_saw(fake, last)) + session.calls[last].completion.token_ids
        assert sum(a.action_mask[seg.start:seg.end]) > 0


AGENT_ASKS = {"temperature": 0.7, "top_p": 0.9, "presence_penalty": 0.5, "frequency_penalty": 0.25,
              "max_tokens": 300, "seed": 11, "stop": ["END"]}
AGENT_EXTRA = {"top_k": 5, "repetition_penalty": 1.2, "min_p": 0.05}


def _ask(session: Any) -> None:
    sdk(session).chat.completions.create(model=session.model, messages=[{"role": "user", "content": "hi"}],
                                         extra_body=AGENT_EXTRA, **AGENT_ASKS)


def test_training_pins_the_runs_sampling_settings_whatever_the_agent_asks_and_records_it():
    with FakeServer([Reply(text="hello")]) as fake:
        _, session = serve(fake, _ask, rule=PinnedSampling(temperature=1.0, max_tokens=200))
    sent = fake.requests[0]["sampling_params"]
    assert {k: sent[k] for k in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                                 "repetition_penalty")} == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                                                            "presence_penalty": 0.0, "frequency_penalty": 0.0,
                                                            "repetition_penalty": 1.0}
    assert sent["max_tokens"] == 200 and sent["seed"] == 11 and sent["stop"] == ["END"]  # bounded; kept
    (call,) = session.calls
    assert call.pinned == ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                           "repetition_penalty")
    assert call.requested == {**AGENT_ASKS, **AGENT_EXTRA}
    assert session.assemble().stats.pinned_calls == 1


def test_evaluation_passes_the_agents_settings_through():
    with FakeServer([Reply(text="hello")]) as fake:
        _, session = serve(fake, _ask, rule=AgentSampling())
    sent = fake.requests[0]["sampling_params"]
    assert {k: sent[k] for k in (*AGENT_ASKS, *AGENT_EXTRA)} == {**AGENT_ASKS, **AGENT_EXTRA}
    assert session.calls[0].pinned == ()


def test_a_call_without_max_tokens_gets_what_the_context_leaves_and_a_prompt_over_it_is_a_400():
    """A completions or token route left without max_tokens answers 16 tokens (vLLM's default); a chat
    route, which agents expect, fills what the context leaves: so does the proxy."""

    def agent(session: Any) -> None:
        client, hi = sdk(session), [{"role": "user", "content": "hi"}]
        client.chat.completions.create(model=session.model, messages=hi)
        client.chat.completions.create(model=session.model, messages=hi, max_tokens=7)  # its own, kept
        with pytest.raises(openai.BadRequestError, match="maximum context length is 300 tokens; the prompt is"):
            client.chat.completions.create(model=session.model, messages=[{"role": "user", "content": "x" * 400}])

    with FakeServer([Reply(text="hello"), Reply(text="hi")]) as fake:
        _, session = serve(fake, agent, rule=AgentSampling(), upstream=token_upstream(fake, max_model_len=300))
    first = fake.requests[0]
    assert first["sampling_params"]["max_tokens"] == 300 - len(first["token_ids"]) > 200  # a ByteTokenizer's prompt
    assert fake.requests[1]["sampling_params"]["max_tokens"] == 7 and len(fake.requests) == 2  # the third never left
    assert [c.served for c in session.calls] == [True, True, False]


def test_a_run_temperature_of_zero_is_pinned_too():
    with FakeServer([Reply(text="hello")]) as fake:
        _, session = serve(fake, _ask, rule=PinnedSampling(temperature=0.0, max_tokens=50))
    assert fake.requests[0]["sampling_params"]["temperature"] == 0.0
    assert session.calls[0].forwarded.temperature == 0.0


def _raw(session: Any, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(method, session.base_url + path, **kw)


def test_errors_are_openai_shaped_and_the_proxy_goes_on():
    def agent(session: Any) -> dict[str, Any]:
        out = {"models": _raw(session, "GET", "/models").json(),
               "not_json": _raw(session, "POST", "/chat/completions", content=b"{not json"),
               "no_messages": _raw(session, "POST", "/chat/completions", json={"model": "m"}),
               "two_choices": _raw(session, "POST", "/chat/completions",
                                   json={"messages": [{"role": "user", "content": "x"}], "n": 2}),
               "bad_temperature": _raw(session, "POST", "/chat/completions",
                                       json={"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
               "image": _raw(session, "POST", "/chat/completions",
                             json={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
               "unknown_route": _raw(session, "GET", "/embeddings")}
        with pytest.raises(openai.BadRequestError, match="maximum context length"):  # the engine's 400, kept
            sdk(session).chat.completions.create(model="m", messages=[{"role": "user", "content": "long"}])
        with pytest.raises(openai.APIStatusError) as down:  # the engine failed: 502, recorded
            sdk(session).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        out["down"] = down.value.status_code
        out["ok"] = sdk(session).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return out

    script = [Reply(status=400, error="This model's maximum context length is 2048 tokens."),
              Reply(status=503, error="overloaded"), Reply(text="fine")]
    with FakeServer(script) as fake:
        out, session = serve(fake, agent)
    assert out["models"]["data"][0]["id"] == "fake"
    for key in ("not_json", "no_messages", "two_choices", "bad_temperature", "image"):
        assert out[key].status_code == 400, key
        assert out[key].json()["error"]["type"] == "invalid_request_error" and out[key].json()["error"]["message"]
    assert "not JSON" in out["not_json"].json()["error"]["message"]
    assert out["unknown_route"].status_code == 404
    assert out["down"] == 502 and out["ok"].choices[0].message.content == "fine"
    # the overflow and the failure are recorded as failed calls; the bad bodies never reached a session
    assert [c.served for c in session.calls] == [False, False, True]
    assert "overloaded" in session.calls[1].error
    assert session.assemble().stats.failed_calls == 2


def test_unknown_and_closed_sessions_are_404_and_a_closed_session_keeps_its_calls():
    async def go() -> None:
        async with CaptureProxy() as proxy:
            with FakeServer([Reply(text="one")]) as fake:
                session = proxy.session(token_upstream(fake), TRAIN, episode_id="ep-1")
                with pytest.raises(ValueError, match="already open"):
                    proxy.session(token_upstream(fake), TRAIN, episode_id="ep-1")
                await asyncio.to_thread(_ask, session)
                session.close()
                closed = await asyncio.to_thread(_raw, session, "POST", "/chat/completions",
                                                 json={"messages": [{"role": "user", "content": "x"}]})
                unknown = await asyncio.to_thread(httpx.get, f"{proxy.url}/sessions/nope/v1/models")
            assert closed.status_code == 404 and "ep-1" in closed.json()["error"]["message"]
            assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
            assert session.n_calls == 1 and session.assemble().stats.calls == 1

    asyncio.run(go())


def test_many_sessions_at_once_each_keep_their_own_calls():
    def responder(request: dict[str, Any], _: str) -> Reply:  # the token route's prompt is its token_ids
        prompt = ByteTokenizer().decode(request["token_ids"])
        return Reply(text="ack " + prompt.split("episode ")[1].split("<")[0])

    async def episode(proxy: CaptureProxy, fake: FakeServer, k: int) -> Any:
        with proxy.session(token_upstream(fake), TRAIN, episode_id=f"episode-{k}") as session:
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"episode {k}"}]
            for turn in range(2):
                r = await client.chat.completions.create(model=session.model, messages=messages, stream=turn == 1)
                if turn == 0:
                    messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
                else:
                    text = "".join([c.choices[0].delta.content or "" async for c in r if c.choices])
                    assert text == f"ack {k}"
            await client.close()
            return session

    async def go() -> list[Any]:
        with FakeServer(responder=responder) as fake:
            async with CaptureProxy() as proxy:
                return await asyncio.gather(*(episode(proxy, fake, k) for k in range(40)))

    sessions = asyncio.run(go())
    for k, session in enumerate(sessions):
        a = session.assemble()
        assert (a.stats.calls, a.stats.merged, len(a.segments)) == (2, 1, 1)
        assert f"ack {k}" in ByteTokenizer().decode(a.token_ids)


def test_text_mode_forwards_to_a_hosted_chat_route_and_records_text():
    native = ({"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},)

    def agent(session: Any) -> Any:
        return sdk(session).chat.completions.create(model=session.model, tools=TOOLS, temperature=0.3,
                                                    messages=[{"role": "user", "content": "1 + 2?"}])

    with FakeServer([Reply(tool_calls=native)], chat_only=True) as fake:
        upstream = TextUpstream(OpenAIChatClient(fake.base_url, "fake", retry=FAST), "fake")
        answer, session = serve(fake, agent, rule=AgentSampling(), upstream=upstream)
    assert answer.choices[0].finish_reason == "tool_calls"
    assert answer.choices[0].message.tool_calls[0].id == "call_9"
    assert fake.requests[0]["temperature"] == 0.3 and fake.requests[0]["tools"] == TOOLS
    a = session.assemble()
    assert a.mode == "text" and a.token_ids == () and a.turns[0].completion_tokens
    with pytest.raises(ValueError, match="training needs the sampled token ids"):
        asyncio.run(_open_session(lambda proxy: proxy.session(upstream, TRAIN)))


async def _open_session(open_it: Callable[[CaptureProxy], Any]) -> None:
    async with CaptureProxy() as proxy:
        open_it(proxy)


@pytest.mark.slow
def test_vllms_own_hermes_parser_parses_tool_calls_in_process():
    pytest.importorskip("vllm")
    from sao.agents.capture.tool_calls import VLLMToolParser, default_tool_parser

    parser = VLLMToolParser(ByteTokenizer())
    reply = parser.parse(CALL_TEXT, TOOLS)
    (call,) = reply.tool_calls
    assert reply.content == "Let me add. "
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("add", {"a": 1, "b": 2})
    assert parser.parse("no call here", TOOLS).tool_calls == ()
    assert isinstance(default_tool_parser(ByteTokenizer()), VLLMToolParser)


def test_the_projects_parser_leaves_a_malformed_call_as_text():
    reply = ProjectToolParser().parse("<tool_call>{not json</tool_call>", TOOLS)
    assert reply == type(reply)("<tool_call>{not json</tool_call>")

