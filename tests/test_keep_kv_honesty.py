"""rollout.keep_kv and refused prefix-cache resets (sao.rl.rollout.served's rule): no token labelled with
a new version is computed over an old-weights prefix without its turn being flagged ``old_kv``. A load
whose reset the engine refuses leaves the replica's KV cache "old" until a retry succeeds; every turn
whose request overlapped that time is flagged, the first refusal is warned about, and the count is a
metric."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from sao.agents import Completion
from sao.agents.clients import SamplingParams
from sao.agents.testing.fake_server import FakeServer
from sao.rl.rollout.served import CLEAN, KVState, ServedVersions
from sao.rl.rollout.versioned_client import VersionedClient
from test_orchestrated import make_async_trainer, slow_responder
from test_train import FakeEngine, lines


class Held:
    """A completion client whose answer waits until the test lets it go."""

    def __init__(self) -> None:
        self.sent = asyncio.Event()
        self.go = asyncio.Event()

    async def complete(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        self.sent.set()
        await self.go.wait()
        return Completion(token_ids=(5, 6), logprobs=(-0.1, -0.2), text="ab", finish_reason="stop")


async def one_turn(served: ServedVersions, during) -> Completion:  # type: ignore[no-untyped-def]
    """One request on replica 0; ``during(served)`` runs while it is in flight."""
    inner = Held()
    client = VersionedClient(inner, lambda: served[0], lambda: served.kv(0))
    task = asyncio.ensure_future(client.complete([1, 2], SamplingParams(max_tokens=4)))
    await inner.sent.wait()
    during(served)
    inner.go.set()
    return await task


@pytest.mark.parametrize(("before", "during", "flagged"), [
    (lambda s: None, lambda s: None, False),  # clean throughout
    (lambda s: None, lambda s: s.old_kv(0), True),  # a refused reset while it ran (keep_kv: its own blocks)
    (lambda s: s.old_kv(0), lambda s: s.kv_reset(0), True),  # sent over old blocks, reset before it came back
    (lambda s: None, lambda s: (s.old_kv(0), s.kv_reset(0)), True),  # old blocks began and ended while it ran
    (lambda s: (s.old_kv(0), s.kv_reset(0)), lambda s: None, False),  # reset before it was sent
])
def test_a_turn_is_flagged_when_its_request_overlapped_old_weights_blocks(before, during, flagged):
    served = ServedVersions(1)
    before(served)
    completion = asyncio.run(one_turn(served, during))
    assert completion.old_kv is flagged


def test_the_kv_state_follows_loads_resets_and_deaths():
    from sao.rl.rollout.schedulers import ReplicaDied

    served = ServedVersions(2)
    assert served.kv(0) == CLEAN and served.refused_resets == 0
    served.old_kv(0)
    assert served.kv(0) == KVState(True, 1) and served.kv(1) == CLEAN and served.refused_resets == 1
    served.apply(ReplicaDied(0, "gone"))  # a restarted engine starts with an empty cache
    assert served.kv(0) == KVState(False, 1)


class RefusingEngine(FakeEngine):
    """Refuses the prefix-cache reset of its second load (version 1) and the first 2 retries, as vLLM does
    while blocks are in use (keep_kv with requests in flight); every other reset goes through."""

    def __init__(self) -> None:
        super().__init__()
        self.resets: list[bool] = []
        self.refused_loads = 0  # loads whose own reset was refused (a retry may land between two loads)
        self.loads = 0
        self.after_load = False
        self.refusals_left = 0

    async def reload_weights(self, path: Path, *, timeout_s: float | None = None) -> None:
        await super().reload_weights(path, timeout_s=timeout_s)
        self.loads += 1
        self.after_load = True
        if self.loads == 2:
            self.refusals_left = 3  # the load's own reset and 2 retries

    async def reset_prefix_cache(self) -> bool:
        ok = self.refusals_left == 0
        self.refusals_left = max(0, self.refusals_left - 1)
        self.resets.append(ok)
        if self.after_load:
            self.refused_loads += not ok
            self.after_load = False
        return ok


def test_refused_resets_under_keep_kv_are_retried_flagged_warned_and_counted(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    engines = [RefusingEngine(), RefusingEngine()]
    with caplog.at_level(logging.INFO, logger="sao.rl.rollout.prefix_resets"), \
            FakeServer(responder=slow_responder) as a, FakeServer(responder=slow_responder) as b:
        trainer = make_async_trainer("async", "sao", tmp_path, [a, b], engines, max_steps=3, keep_kv=True)
        asyncio.run(trainer.run())
    rows = lines(tmp_path / "metrics.jsonl")
    refused = sum(e.resets.count(False) for e in engines)
    assert refused == 6 and rows[-1]["rollout/prefix_reset_refused"] == sum(e.refused_loads for e in engines) >= 2
    # the refused load's reset was retried until it went through
    assert all(e.resets[1:5] == [False, False, False, True] for e in engines), [e.resets for e in engines]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "prefix cache not reset" in r.message]
    assert 1 <= len(warnings) <= 2 and "rollout.keep_kv" in warnings[0].message  # the first per replica
    assert all("rollout/old_kv_turns" in r for r in rows)
    turns = [turn for t in map(json.loads, (tmp_path / "trajectories.jsonl").read_text().splitlines())
             for turn in t["turns"]]
    # a turn that the refused load (version 1) landed in ran on over its own old-weights blocks: flagged. (Only
    # that load: this fake engine lets the other loads' resets through even with requests in flight, which vLLM
    # refuses; on a busy machine a turn can span one of those, and the rule rightly leaves it unflagged.)
    split = [turn for turn in turns if turn["policy_versions"]["first"] < 1 <= turn["policy_versions"]["last"]]
    assert all(turn["old_kv"] for turn in split), split
    assert sum(turn["old_kv"] for turn in turns) >= 1 and not all(turn["old_kv"] for turn in turns)
