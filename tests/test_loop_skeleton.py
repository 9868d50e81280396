"""The episode skeleton (sao.agents.loop.skeleton) with a sampler that has no tokens and no HTTP: the
shape of a third loop (an external agent's calls), driven through the same limits and records."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

import sao.envs as E
from sao.agents.errors import ContextOverflowError, EngineUnavailableError
from sao.agents.loop.skeleton import LoopConfig, Reply, Sampled, TurnSampler, run_turns
from sao.agents.records import TurnRecord
from sao.envs.arithmetic import make_task

TASK = "mul-d1-s0-i0"
GOLD = make_task("mul", 1, 0, 0).answer


class ScriptedSampler:
    """Replies from a script (a string, or an exception to raise); records what the skeleton asked."""

    def __init__(self, script: list[str | BaseException], *, spent: int = 3, context: int | None = None,
                 finish_reason: str = "stop"):
        self.script, self.spent, self.context, self.finish_reason = list(script), spent, context, finish_reason
        self.observed: list[list[dict]] = []
        self.asked: list[tuple[int, int | None, int]] = []  # (max_tokens, seed, messages seen)

    def observe(self, obs):
        self.observed.append(obs)

    def context_left(self) -> int | None:
        return self.context

    async def sample(self, messages: Sequence[dict], params, clock) -> Reply:
        self.asked.append((params.max_tokens, params.seed, len(messages)))
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        if self.context is not None:
            self.context -= self.spent
        t = clock()
        return Reply(item, self.finish_reason, self.spent, TurnRecord(0, 0, self.finish_reason, "w1", t, clock()))

    def sampled(self) -> Sampled:
        return Sampled()


def play(sampler: TurnSampler, cfg: LoopConfig = LoopConfig(), *, feedback_turns: int = 3, seed: int | None = 4):
    env = E.make("arithmetic", feedback_turns=feedback_turns)
    return asyncio.run(run_turns(env, sampler, cfg, env_name="arithmetic", task_id=TASK, sample=1, seed=seed,
                                 episode_id="ep"))


def test_a_sampler_sees_each_observation_that_did_not_end_the_episode_and_the_transcript_so_far():
    s = ScriptedSampler(["no", "3", f"\\boxed{{{GOLD}}}"])
    t = play(s)
    assert t.status == "ok" and t.correct and t.terminated and not t.truncated and t.reward == 1.0
    assert (t.episode_id, t.sample, t.seed, t.mode, t.token_ids) == ("ep", 1, 4, "text", ())
    assert len(s.observed) == 3  # the first observation and two feedbacks; none after the graded answer
    # budget 1024 - 3 per turn; seed * 1000 + turn; the env saw 1, then 3, then 5 messages
    assert s.asked == [(1024, 4000, 1), (1021, 4001, 3), (1018, 4002, 5)]
    assert [m["role"] for m in t.messages] == ["user", "assistant"] * 3
    assert [turn.weight_version for turn in t.turns] == ["w1"] * 3


@pytest.mark.parametrize(("cfg", "context", "truncated_by", "turns"), [
    (LoopConfig(max_turns=2), None, "max_turns", 2),
    (LoopConfig(max_tokens=6), None, "max_tokens", 2),  # 3 + 3 spent: nothing left for a third turn
    (LoopConfig(max_tokens=100), 5, "context", 2),  # 5 - 3 = 2 left, then -1: the context is full
])
def test_limits_end_the_episode_truncated_and_say_which(cfg, context, truncated_by, turns):
    t = play(ScriptedSampler(["no"] * 5, context=context), cfg, feedback_turns=9)
    assert t.status == "ok" and t.truncated and not t.terminated and len(t.turns) == turns
    assert t.info["truncated_by"] == truncated_by and t.info["correct"] is False and t.info["answer"] is None


def test_an_unknown_context_leaves_room_to_the_budget_and_the_per_turn_cap():
    s = ScriptedSampler(["no", "no"], context=None)
    play(s, LoopConfig(max_tokens=10, max_tokens_per_turn=4, max_model_len=1), feedback_turns=1)
    assert [max_tokens for max_tokens, _, _ in s.asked] == [4, 4]  # max_model_len is not the sampler's limit


def test_a_graded_answer_cut_by_a_limit_is_terminated_and_truncated():
    t = play(ScriptedSampler([f"\\boxed{{{GOLD}}}"], finish_reason="length"), LoopConfig(max_tokens=8))
    assert t.terminated and t.truncated and t.correct and t.info["truncated_by"] == "max_tokens"


def test_a_context_overflow_truncates_and_an_engine_failure_is_recorded_not_raised():
    t = play(ScriptedSampler(["no", ContextOverflowError("too long")]))
    assert t.status == "ok" and t.truncated and t.info["truncated_by"] == "context" and len(t.turns) == 1
    t = play(ScriptedSampler(["no", EngineUnavailableError("down")]))
    assert t.status == "failed" and t.failure == "infra_error" and t.error == "EngineUnavailableError: down"
    assert not t.terminated and not t.truncated and len(t.turns) == 1 and len(t.messages) == 3
    assert t.info["correct"] is False and t.info["error"] == t.error


def test_the_seed_scheme_is_one_pure_function_for_training_and_evaluation():
    from sao.agents.loop import episode_seed, turn_seed

    # (seed * 1_000_003 + index * 1_009 + sample) mod 2^31: 7_000_021 + 3_027 + 1
    assert episode_seed(7, 3, 1) == 7_003_049
    assert episode_seed(3000, 0, 0) == 3_000_009_000 - 2**31  # wraps into [0, 2^31)
    assert len({episode_seed(1, i, s) for i in range(50) for s in range(8)}) == 400
    assert turn_seed(4, 2) == 4002 and turn_seed(None, 2) is None
