"""``sao-eval``'s records of answers cut by the token budget (issue 14): graded, truncated, counted."""

from __future__ import annotations

import itertools
import re

from sao.agents.store import read_trajectories
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.evals.runner import EvalConfig, evaluate

_QUESTION = re.compile(r"What is (\d+) ([-+*/]) (\d+)\?")


def right_answer(prompt: str) -> int:
    a, op, b = _QUESTION.search(prompt).groups()  # type: ignore[union-attr]
    a, b = int(a), int(b)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]


def test_summary_counts_budget_cut_answers_as_truncated_and_they_are_still_graded(tmp_path):
    calls = itertools.count()

    def every_other_cut(request: dict, prompt: str) -> Reply:  # right answers; every other one cut at max_tokens
        return Reply(text=f"\\boxed{{{right_answer(prompt)}}}", finish_reason="length" if next(calls) % 2 else "stop")

    with FakeServer(responder=every_other_cut, chat_only=True) as server:
        summary = evaluate(EvalConfig(benchmark="arithmetic", output=tmp_path / "out", base_url=server.base_url,
                                      model="org/hosted-model", endpoint_mode="chat", limit=4, samples=2,
                                      concurrency=2, max_tokens=64, max_turns=4, timeout_s=10.0))
    assert summary["n_episodes"] == 8 and summary["n_truncated"] == 4 and summary["pass@1"] == 1.0
    assert summary["exit_status"] == {"max_tokens": 4, "terminated": 4}  # a cut answer: the limit that cut it
    trajectories = read_trajectories(tmp_path / "out" / "trajectories.jsonl")
    cut = [t for t in trajectories if t.turns[-1].finish_reason == "length"]
    assert len(cut) == 4 and all(t.truncated and t.terminated and t.correct for t in cut)
    assert all(t.info["truncated_by"] == "max_tokens" for t in cut)
    assert all(t.terminated and not t.truncated for t in trajectories if t not in cut)
