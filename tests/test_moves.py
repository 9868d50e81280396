"""A running request moved between two scripted replicas of one version (sao.rl.rollout.moves).

Two :class:`FakeServer` replicas; a move seats the trajectory on the target, the source's drain aborts
it (``FakeServer.abort``, as vLLM's ``/pause?mode=abort`` answers a request with its tokens so far), and
the request goes on on the target from the prompt plus those tokens. The replicas report different
log-probs (-0.5 and -0.9), so the merged completion shows which tokens each one sampled.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from sao.agents import ByteTokenizer, Completion, OpenAICompletionClient, RetryPolicy, VersionSpan
from sao.agents.clients import SamplingParams
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.rl.rollout.moves import Moves, continued, merge
from sao.rl.rollout.schedulers import MoveTrajectory
from sao.rl.rollout.served import ServedVersions
from sao.rl.rollout.versioned_client import VersionedClient
from sao.rl.weights import Served

ANSWER = "The answer is \\boxed{42}."
TOK = ByteTokenizer()


def rest_of_answer(delay_s: float, logprob: float):  # type: ignore[no-untyped-def]
    """A responder that answers ANSWER, or its rest when the prompt already ends with a start of it."""
    def respond(request: dict, prompt: str) -> Reply:
        said = prompt.rsplit("\n", 1)[-1]
        rest = ANSWER[len(said):] if ANSWER.startswith(said) else ANSWER
        return Reply(text=rest, logprob=logprob, delay_s=delay_s)
    return respond


class AbortingControl:
    """The source's control endpoints: a pause in "abort" mode aborts what its server runs."""

    def __init__(self, server: FakeServer) -> None:
        self.server, self.pauses = server, []  # type: ignore[var-annotated]

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.pauses.append(mode)
        if mode == "abort":
            self.server.abort()


def moves_over(servers: list[FakeServer], version: int = 3) -> tuple[Moves, ServedVersions]:
    versions = ServedVersions(len(servers))
    for rid in range(len(servers)):
        versions.apply(Served(rid, version))
    retry = RetryPolicy(max_retries=0, backoff_s=0.01, max_backoff_s=0.01)
    clients = [OpenAICompletionClient(s.base_url, "fake", timeout_s=10, retry=retry) for s in servers]
    return Moves(lambda r: VersionedClient(clients[r], lambda: versions[r]), retry_s=0.2), versions


PROMPT = list(TOK.encode("<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"))


def test_a_moved_request_goes_on_on_the_target_from_its_partial_tokens() -> None:
    """Replica 0 holds the request (its reply takes 30 s); the move seats it on replica 1, the drain
    aborts replica 0 and the request comes back with half its tokens; replica 1 samples the rest."""
    full = len(TOK.encode(ANSWER)) + 1  # + EOS
    with FakeServer(responder=rest_of_answer(30.0, -0.5)) as a, FakeServer(responder=rest_of_answer(0.0, -0.9)) as b:
        moves, _ = moves_over([a, b])

        async def go() -> Completion:
            client = moves.client(7, 0)
            turn = asyncio.ensure_future(client.complete(PROMPT, SamplingParams(max_tokens=64, seed=5)))
            await asyncio.sleep(0.3)  # the request runs on replica 0
            assert not moves.move(MoveTrajectory(7, 0, 1, 3), running=True)
            await asyncio.wait_for(moves.drain(0, AbortingControl(a)), 10)  # type: ignore[arg-type]
            done = await asyncio.wait_for(turn, 10)
            assert moves.leave(7, 0) == 1  # it ended seated on the target
            return done

        done = asyncio.run(go())
    half = (full - 1) // 2  # FakeServer.abort: half of the reply's tokens (the EOS is only sent on "stop")
    assert TOK.decode(list(done.token_ids), skip_special_tokens=True) == ANSWER
    assert done.finish_reason == "stop" and len(done.token_ids) == full
    assert done.logprobs == (-0.5,) * half + (-0.9,) * (full - half)  # the partial tokens' log-probs kept
    assert done.policy_versions == VersionSpan(3, 3) and done.token_versions == ((3, full),)  # one version
    assert done.attempts == 2 and done.prompt_ids == tuple(PROMPT)
    sent = b.requests[-1]
    assert sent["prompt"] == PROMPT + list(TOK.encode(ANSWER))[:half]  # prompt + the partial tokens
    assert sent["max_tokens"] == 64 - half and sent["seed"] == (5 + 1_000_003 * half) % (1 << 31)
    assert a.aborted == 1 and moves.stats() == {"rollout/moved": 1.0, "rollout/moved_requests": 1.0,
                                                "rollout/moved_tokens": float(half)}


def test_a_request_that_finished_before_the_abort_is_whole_and_the_next_turn_goes_to_the_target() -> None:
    with FakeServer(responder=rest_of_answer(0.0, -0.5)) as a, FakeServer(responder=rest_of_answer(0.0, -0.9)) as b:
        moves, _ = moves_over([a, b])

        async def go() -> tuple[Completion, Completion]:
            client = moves.client(7, 0)
            first = await client.complete(PROMPT, SamplingParams(max_tokens=64))
            moves.move(MoveTrajectory(7, 0, 1, 3), running=True)
            control = AbortingControl(a)
            await asyncio.wait_for(moves.drain(0, control), 10)  # type: ignore[arg-type]
            assert control.pauses == ["abort"]  # nothing was out: one abort, no wait
            return first, await client.complete(PROMPT, SamplingParams(max_tokens=64))

        first, second = asyncio.run(go())
    assert first.finish_reason == "stop" and set(first.logprobs) == {-0.5}  # all sampled on replica 0
    assert second.finish_reason == "stop" and set(second.logprobs) == {-0.9}  # the next turn on replica 1
    assert len(a.requests) == 1 and len(b.requests) == 1 and a.aborted == 0
    assert moves.stats()["rollout/moved_requests"] == 0.0


def test_an_abort_that_no_move_asked_for_is_returned_as_the_engine_said() -> None:
    with FakeServer(responder=rest_of_answer(30.0, -0.5)) as a:
        moves, _ = moves_over([a])

        async def go() -> Completion:
            turn = asyncio.ensure_future(moves.client(1, 0).complete(PROMPT, SamplingParams(max_tokens=64)))
            await asyncio.sleep(0.3)
            a.abort()
            return await asyncio.wait_for(turn, 10)

        done = asyncio.run(go())
    assert done.finish_reason == "abort" and len(done.token_ids) == len(ANSWER) // 2 and len(a.requests) == 1


def test_a_drain_that_never_empties_times_out() -> None:
    moves = Moves(lambda r: None, drain_timeout_s=0.1, retry_s=0.05)  # type: ignore[arg-type, return-value]
    moves._out[0] = 1  # a request that never comes back
    moves.move(MoveTrajectory(1, 0, 1, 0), running=False)

    class Control:
        async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
            pass

    with pytest.raises(TimeoutError, match="1 request"):
        asyncio.run(moves.drain(0, Control()))  # type: ignore[arg-type]
    asyncio.run(moves.drain(0, Control()))  # type: ignore[arg-type]  # drained once: the next load does not wait


def test_merge_keeps_every_part_in_order() -> None:
    a = Completion((1, 2), (-0.1, -0.2), "ab", "abort", prompt_ids=(9,), policy_versions=VersionSpan(2, 2),
                   token_versions=((2, 2),), attempts=1)
    empty = Completion((), (), "", "abort", policy_versions=VersionSpan(2, 2), attempts=1)  # aborted before a token
    b = Completion((3,), (-0.3,), "c", "length", prompt_ids=(9, 1, 2), policy_versions=VersionSpan(2, 2),
                   token_versions=((2, 1),), attempts=2, old_kv=True)
    m = merge([a, empty, b])
    assert (m.token_ids, m.logprobs, m.text, m.finish_reason) == ((1, 2, 3), (-0.1, -0.2, -0.3), "abc", "length")
    assert m.prompt_ids == (9,) and m.policy_versions == VersionSpan(2, 2) and m.token_versions == ((2, 3),)
    assert m.attempts == 4 and m.old_kv
    assert merge([a]) is a


def test_a_continuation_asks_for_what_is_left() -> None:
    p = SamplingParams(max_tokens=10, seed=1)
    assert continued(p, 0) is p
    assert continued(p, 4) == SamplingParams(max_tokens=6, seed=1 + 4_000_012)
    assert continued(SamplingParams(max_tokens=None), 4) == SamplingParams(max_tokens=None)


def test_out_counts_come_back_to_zero_when_a_request_fails() -> None:
    with FakeServer([Reply(status=500, error="boom")]) as a:
        moves, _ = moves_over([a])
        with pytest.raises(Exception, match="boom"):
            asyncio.run(moves.client(1, 0).complete(PROMPT, SamplingParams(max_tokens=8)))
    assert moves._out == Counter({0: 0})


def test_an_episode_its_source_death_cancelled_before_the_move_is_ended_by_the_move() -> None:
    """Replica 0 died (the driver cancelled trajectory 5 on it) before the scheduler, not yet told, moved 5
    to replica 1: the source's ReplicaDied no longer re-queues it, so the move says the driver must end it."""
    moves = Moves(lambda r: None)  # type: ignore[arg-type, return-value]
    moves.forget(0, [5])
    assert moves.move(MoveTrajectory(5, 0, 1, 2), running=False) is True
    assert moves.move(MoveTrajectory(5, 1, 0, 2), running=False) is False  # said once
    assert moves.stats()["rollout/moved"] == 0.0


def test_a_move_before_the_episode_started_seats_it_on_the_target() -> None:
    moves = Moves(lambda r: None)  # type: ignore[arg-type, return-value]
    moves.move(MoveTrajectory(3, 0, 1, 0), running=True)
    assert moves.client(3, 0).seat.replica == 1 and moves.leave(3, 0) == 1
