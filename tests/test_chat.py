"""Chat rendering in tokens: the bridge between turns reproduces the template, token for token."""

from __future__ import annotations

import pytest

from sao.agents import ByteTokenizer, ChatRenderer, Completion, RenderError
from sao.agents.loop.tools import assistant_message, parse_tool_calls


def _completion(tok, text, *, eos=True):
    ids = tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    return Completion(tuple(ids), (0.0,) * len(ids), text, "stop" if eos else "length")


@pytest.fixture(params=["bytes", "smollm2"])
def tokenizer(request):
    if request.param == "bytes":
        return ByteTokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(request.getfixturevalue("smollm2_dir"))


def test_bridge_equals_rendering_the_whole_conversation(tokenizer):
    r = ChatRenderer(tokenizer)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    ids = r.prompt(history)
    for turn, (said, reply) in enumerate([("It is 5.", "Wrong, try again."), ("4", "Why?"), ("Because.", "Ok.")]):
        c = _completion(tokenizer, said)
        ids += list(c.token_ids) + r.bridge(history, c, [{"role": "user", "content": reply}])
        history += [{"role": "assistant", "content": said}, {"role": "user", "content": reply}]
        assert ids == r.prompt(history), f"drift after turn {turn}"


def test_bridge_adds_the_end_of_turn_marker_when_the_model_did_not_sample_it(tokenizer):
    r = ChatRenderer(tokenizer)
    history = [{"role": "user", "content": "Count."}]
    c = _completion(tokenizer, "1 2 3", eos=False)
    bridge = r.bridge(history, c, [{"role": "user", "content": "More."}])
    assert bridge[0] == tokenizer.eos_token_id
    full = r.prompt([*history, {"role": "assistant", "content": "1 2 3"}, {"role": "user", "content": "More."}])
    assert r.prompt(history) + list(c.token_ids) + bridge == full


def test_a_template_that_rewrites_history_is_refused():
    class Rewriting(ByteTokenizer):
        def apply_chat_template(self, conversation, **kw):  # shows only the last message
            return super().apply_chat_template(conversation[-1:], **kw)

    r = ChatRenderer(Rewriting())
    with pytest.raises(RenderError, match="re-renders earlier messages"):
        r.bridge([{"role": "user", "content": "a"}], _completion(ByteTokenizer(), "b"), [{"role": "user", "content": "c"}])


def test_tool_call_parsing():
    text = ('Let me run it.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>\n'
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"2\\"}"}</tool_call>'
            '<tool_call>{"name": "python", "arguments": {bad json}}</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call>')
    calls, errors = parse_tool_calls(text, turn=3)
    assert [c["function"]["name"] for c in calls] == ["python", "python"]
    assert calls[0]["function"]["arguments"] == '{"code": "print(1)"}' and calls[0]["id"] == "call_3_0"
    assert calls[1]["function"]["arguments"] == '{"code": "2"}'
    assert len(errors) == 2 and "not valid JSON" in errors[0] and 'no "name"' in errors[1]
    msg = assistant_message(text, tools_offered=True)
    assert len(msg["tool_calls"]) == 2 and len(msg["invalid_tool_calls"]) == 2
    assert assistant_message(text, tools_offered=False) == {"role": "assistant", "content": text}
