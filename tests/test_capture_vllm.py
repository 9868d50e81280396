"""The capture proxy in front of the REAL engine (vLLM with the bundled model, on its token route): the
unchanged openai SDK through the proxy, with training's pinned rule at temperature 0 (greedy).

* the captured ids and log-probs equal the engine's own answer to a direct token-route request with the
  same prompt ids and settings;
* the model's tool call (a few-shot history makes the greedy model write one) is parsed by vLLM's own
  Hermes parser, in process, and comes back as an OpenAI tool call;
* the tool result's call extends the first exactly: the 2-call conversation is one segment.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from sao.agents.capture import CaptureProxy, PinnedSampling, TokenUpstream, VLLMToolParser
from sao.agents.clients.generate import GenerateClient, generate_base_url
from sao.agents.loop.episodes import Renderers

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.part("vllm-token-route")]

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                          "b": {"type": "integer"}},
                                                          "required": ["a", "b"]}}}]


def _few_shot(a: int, b: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{a}_{b}", "type": "function",
                            "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}]}


HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You add numbers by calling the add tool."},
    {"role": "user", "content": "Add 2 and 3."}, _few_shot(2, 3), {"role": "tool", "tool_call_id": "call_2_3", "content": "5"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "Add 7 and 1."}, _few_shot(7, 1), {"role": "tool", "tool_call_id": "call_7_1", "content": "8"},
    {"role": "assistant", "content": "8"},
    {"role": "user", "content": "Add 4 and 6."},
]


def test_the_openai_sdk_through_the_proxy_on_the_real_engine(vllm_server):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(vllm_server.config.model))
    client = GenerateClient(generate_base_url(vllm_server.root_url), vllm_server.model_name)
    upstream = TokenUpstream(client, Renderers(tokenizer), VLLMToolParser(tokenizer, "hermes"), vllm_server.model_name)

    def agent(session: Any) -> tuple[Any, Any]:
        sdk = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        messages = list(HISTORY)
        first = sdk.chat.completions.create(model=session.model, messages=messages, tools=TOOLS, temperature=0.7,
                                            top_p=0.9)
        message = first.choices[0].message
        calls = message.tool_calls or []
        messages += [message.model_dump(exclude_none=True),
                     *({"role": "tool", "tool_call_id": c.id, "content": "10"} for c in calls)]
        if not calls:
            messages.append({"role": "user", "content": "Use the tool."})
        second = sdk.chat.completions.create(model=session.model, messages=messages, tools=TOOLS, stream=True)
        return first, "".join(c.choices[0].delta.content or "" for c in second if c.choices)

    async def go() -> tuple[Any, Any, Any]:
        async with CaptureProxy() as proxy:
            with proxy.session(upstream, PinnedSampling(temperature=0.0, max_tokens=48)) as session:
                first, _ = await asyncio.to_thread(agent, session)
            call = session.calls[0]
            direct = await client.complete(call.prompt_ids, call.forwarded)  # the same prompt ids and settings
            await client.aclose()
            return first, session, direct

    first, session, direct = asyncio.run(go())
    call = session.calls[0]
    print(f"\nfirst answer: {call.completion.text!r}; pinned {call.pinned}; stats {session.assemble().stats}")
    assert call.pinned == ("temperature", "top_p") and call.forwarded.temperature == 0.0
    assert call.completion.token_ids == direct.token_ids  # exactly what the engine answers
    assert call.completion.logprobs == direct.logprobs
    (tool_call,) = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls"
    assert tool_call.function.name == "add" and json.loads(tool_call.function.arguments) == {"a": 4, "b": 6}
    a = session.assemble()
    assert (a.stats.calls, a.stats.merged, a.stats.split) == (2, 1, 0) and len(a.segments) == 1
    assert a.token_ids[:len(call.prompt_ids)] == call.prompt_ids
