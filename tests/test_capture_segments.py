"""Trajectories from captured calls (sao.agents.capture.segments): merges, splits and their reasons, on
hand-made calls whose ids are written out."""

from __future__ import annotations

import pytest

from sao.agents.capture.calls import CapturedCall
from sao.agents.capture.segments import assemble
from sao.agents.clients.completions import SamplingParams
from sao.agents.records import ChatCompletion, Completion, Segment, Trajectory

PARAMS = SamplingParams(max_tokens=8)


def call(index: int, prompt: list[int], sampled: list[int], *, pinned: tuple[str, ...] = (),
         versions: tuple[tuple[int, int], ...] | None = None) -> CapturedCall:
    completion = Completion(tuple(sampled), tuple(-0.1 * (i + 1) for i in range(len(sampled))), "x", "stop",
                            token_versions=versions)
    return CapturedCall(index=index, messages=({"role": "user", "content": "q"},), tools=(), requested={},
                        forwarded=PARAMS, pinned=pinned, reply={"role": "assistant", "content": "x"},
                        prompt_ids=tuple(prompt), completion=completion, t_start=index, t_end=index + 0.5)


def failed(index: int) -> CapturedCall:
    return CapturedCall(index=index, messages=(), tools=(), requested={}, forwarded=PARAMS, pinned=(), reply=None,
                        error="EngineUnavailableError: down")


def test_a_call_that_extends_the_previous_one_merges_with_the_observation_masked():
    # call 0: prompt [1 2 3] -> sampled [10 11]; call 1: prompt [1 2 3 10 11 20 21] -> sampled [12]
    # tokens: 1 2 3 | 10 11 | 20 21 | 12 ; mask 0 0 0 1 1 0 0 1
    a = assemble([call(0, [1, 2, 3], [10, 11], versions=((4, 2),)), call(1, [1, 2, 3, 10, 11, 20, 21], [12])])
    assert a.token_ids == (1, 2, 3, 10, 11, 20, 21, 12)
    assert a.action_mask == (0, 0, 0, 1, 1, 0, 0, 1)
    assert a.logprobs == pytest.approx((0, 0, 0, -0.1, -0.2, 0, 0, -0.1))
    assert a.segments == (Segment(0, 8, "first"),)
    assert [(t.prompt_len, t.completion_len) for t in a.turns] == [(3, 2), (7, 1)]
    assert a.turns[0].token_versions == ((4, 2),)
    assert (a.stats.calls, a.stats.merged, a.stats.split, a.stats.split_reasons) == (2, 1, 0, {})
    assert a.mode == "tokens"


def test_a_history_rewrite_splits_and_each_segment_holds_what_the_engine_saw():
    # call 1 rewrote token 1 (position 1): a new segment; call 2 extends call 1; call 3 asks again with a
    # shorter history (a prefix of segment 2): a third segment
    calls = [call(0, [1, 2, 3], [10]), call(1, [1, 9, 3, 10, 30], [11, 12]), call(2, [1, 9, 3, 10, 30, 11, 12, 40], [13]),
             call(3, [1, 9, 3], [14])]
    a = assemble(calls)
    assert a.segments == (Segment(0, 4, "first"), Segment(4, 13, "prefix_changed", 1),
                          Segment(13, 17, "history_shorter", 3))
    assert a.stats.split == 2 and a.stats.merged == 1
    assert a.stats.split_reasons == {"prefix_changed": 1, "history_shorter": 1}
    for seg, engine_saw in zip(a.segments, ([calls[0]], calls[1:3], [calls[3]])):
        ids = a.token_ids[seg.start:seg.end]
        last = engine_saw[-1]
        assert ids == last.prompt_ids + last.completion.token_ids  # what the engine was given, then sampled
        assert sum(a.action_mask[seg.start:seg.end]) > 0  # each segment is trainable
    # a turn's prompt is the segment's tokens up to it
    assert a.token_ids[a.segments[1].start:a.turns[2].prompt_len] == calls[2].prompt_ids


def test_failed_calls_are_counted_and_left_out_and_pinned_calls_counted():
    a = assemble([call(0, [1, 2], [3], pinned=("temperature",)), failed(1), call(2, [1, 2, 3, 4], [5])])
    assert a.token_ids == (1, 2, 3, 4, 5)
    assert (a.stats.calls, a.stats.failed_calls, a.stats.pinned_calls, a.stats.merged) == (2, 1, 1, 1)


def test_the_assembled_episode_is_a_trajectory_and_survives_json():
    a = assemble([call(0, [1, 2], [3]), call(1, [7, 2], [4])])
    t = Trajectory(episode_id="e", env="arithmetic", task_id="t", sample=0, seed=None, token_ids=a.token_ids,
                   action_mask=a.action_mask, logprobs=a.logprobs, turns=a.turns, messages=a.messages, reward=1.0,
                   terminated=True, truncated=False, status="ok", segments=a.segments)
    assert Trajectory.from_json(t.to_json()) == t
    assert t.segments[1] == Segment(3, 6, "prefix_changed", 0)
    with pytest.raises(ValueError, match="do not cover"):
        Trajectory(**{**t.__dict__, "segments": (Segment(0, 3, "first"),)})


def test_text_calls_assemble_into_a_text_record_without_tokens():
    chat = ChatCompletion("hi", "stop", prompt_tokens=12, completion_tokens=3)
    text = CapturedCall(index=0, messages=({"role": "user", "content": "q"},), tools=(), requested={},
                        forwarded=PARAMS, pinned=(), reply={"role": "assistant", "content": "hi"}, chat=chat)
    a = assemble([text])
    assert a.mode == "text" and a.token_ids == () and a.segments == ()
    assert (a.turns[0].prompt_tokens, a.turns[0].completion_tokens) == (12, 3)
    assert a.messages[-1] == {"role": "assistant", "content": "hi"}
    with pytest.raises(ValueError, match="not both"):
        assemble([text, call(1, [1], [2])])
