"""The ledger's counts as typed records: read by attribute, parsed strictly, checkpointed with the same
JSON keys as before (``source.counts``: admitted, trained, requeued, failed)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sao.rl.errors import CheckpointError, LedgerError
from sao.rl.rollout.schedulers import ClosedCounts, Ledger, LedgerCounts, Prompt


def _ledger() -> Ledger:
    """Three attempts: one trained, one requeued, one still in flight."""
    ledger = Ledger()
    for tid in range(3):
        ledger.admit(tid, Prompt(group_id=tid), replica=0, version=0, now=0.0)
    ledger.finish(0, (0,), 5, 1.0)
    ledger.train([0], step=1)
    ledger.requeue(1, "engine died")
    return ledger


def test_tally_and_stats_give_the_same_counts():
    ledger = _ledger()
    counts = ledger.tally()
    assert counts == LedgerCounts(admitted=3, in_flight=1, waiting=0, trained=1, requeued=1, failed=0, requests=3)
    assert LedgerCounts.from_stats(ledger.summary()) == counts
    assert counts.open == 1  # in flight 1 + waiting 0


def test_a_count_the_ledger_never_moved_is_zero():
    # a fresh ledger's summary has no ledger/ keys at all
    assert LedgerCounts.from_stats(Ledger().summary()) == LedgerCounts()


def test_a_misspelled_ledger_key_fails_instead_of_counting_zero():
    with pytest.raises(LedgerError, match=r"unknown ledger count\(s\) \['requeud'\]"):
        LedgerCounts.from_stats({"ledger/admitted": 2.0, "ledger/requeud": 1.0, "staleness/max": 0.0})
    with pytest.raises(AttributeError):
        _ledger().tally().requeud  # noqa: B018  # a reader's typo fails too
    with pytest.raises(dataclasses.FrozenInstanceError):
        _ledger().tally().admitted = 0  # type: ignore[misc]


def test_closed_counts_keep_the_checkpoint_keys():
    counts = ClosedCounts(admitted=7.0, trained=4.0, requeued=2.0, failed=1.0)
    # exactly what checkpoints held before the record: these keys, in this order, as floats
    assert json.dumps(counts.to_json()) == '{"admitted": 7.0, "trained": 4.0, "requeued": 2.0, "failed": 1.0}'
    assert ClosedCounts.from_json(json.loads(json.dumps(counts.to_json()))) == counts


def test_an_old_checkpoint_without_some_counts_loads_them_as_zero():
    assert ClosedCounts.from_json({}) == ClosedCounts()
    assert ClosedCounts.from_json({"admitted": 3, "trained": 2}) == ClosedCounts(admitted=3.0, trained=2.0)


def test_an_unknown_checkpoint_count_is_an_error():
    with pytest.raises(CheckpointError, match=r"unknown key\(s\) \['trainde'\] \(known: admitted, trained, "
                                              r"requeued, failed\)"):
        ClosedCounts.from_json({"admitted": 3.0, "trainde": 2.0})
