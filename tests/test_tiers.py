"""The suite's tiers (tests/tiers.py), the long tier's quarter table, CI's choice of quarter, and the
closing table of the real parts (tests/parts.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.parts import PARTS, PartsTable, mark_items
from tests.tiers import TABLE, QuarterTable, base_id, select

REPO = Path(__file__).resolve().parents[1]


@dataclass
class FakeItem:
    nodeid: str
    marks: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()
    user_properties: list = field(default_factory=list)

    def get_closest_marker(self, name: str):  # type: ignore[no-untyped-def]
        return pytest.mark.__getattr__(name) if name in self.marks else None

    def iter_markers(self, name: str):  # type: ignore[no-untyped-def]
        if name == "part" and self.parts:
            yield pytest.mark.part(*self.parts).mark


class FakeConfig:
    def __init__(self, tier: str = "all", quarter: int | None = None, alone: str = "include"):
        self.options = {"tier": tier, "long_quarter": quarter, "alone": alone}
        self.deselected: list = []
        self.hook = self

    def getoption(self, name: str):  # type: ignore[no-untyped-def]
        return self.options[name]

    def pytest_deselected(self, items):  # type: ignore[no-untyped-def]
        self.deselected.extend(items)


def _items() -> list[FakeItem]:
    return [FakeItem("tests/test_a.py::test_unit"), FakeItem("tests/test_a.py::test_long_q", ("long",)),
            FakeItem("tests/test_b.py::test_alone_long", ("long", "alone")), FakeItem("tests/test_b.py::test_alone", ("alone",))]


def _selected(config: FakeConfig, monkeypatch: pytest.MonkeyPatch, quarters: dict[str, int] | None = None) -> list[str]:
    if quarters is not None:
        monkeypatch.setattr(QuarterTable, "load", classmethod(lambda cls, path=TABLE: QuarterTable(quarters, {}, "")))
    items = _items()
    select(config, items)  # type: ignore[arg-type]
    assert sorted(i.nodeid for i in items + config.deselected) == sorted(i.nodeid for i in _items())  # a partition
    return [i.nodeid.rsplit("::", 1)[1] for i in items]


def test_the_tiers_partition_the_suite_and_the_quarter_adds_its_long_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    q = {"tests/test_a.py::test_long_q": 2, "tests/test_b.py::test_alone_long": 3}
    assert _selected(FakeConfig("all"), monkeypatch) == ["test_unit", "test_long_q", "test_alone_long", "test_alone"]
    assert _selected(FakeConfig("default"), monkeypatch) == ["test_unit", "test_alone"]
    assert _selected(FakeConfig("long"), monkeypatch) == ["test_long_q", "test_alone_long"]
    assert _selected(FakeConfig("default", 2), monkeypatch, q) == ["test_unit", "test_long_q", "test_alone"]
    assert _selected(FakeConfig("default", 3), monkeypatch, q) == ["test_unit", "test_alone_long", "test_alone"]
    assert _selected(FakeConfig("long", 3), monkeypatch, q) == ["test_alone_long"]
    assert _selected(FakeConfig("long", 1), monkeypatch, q) == []
    # scripts/test's two calls: the alone tests after the others, with the same tier
    assert _selected(FakeConfig("default", alone="exclude"), monkeypatch) == ["test_unit"]
    assert _selected(FakeConfig("default", alone="only"), monkeypatch) == ["test_alone"]  # not the 2-node run
    assert _selected(FakeConfig("long", 3, alone="only"), monkeypatch, q) == ["test_alone_long"]
    assert _selected(FakeConfig("long", 2, alone="only"), monkeypatch, q) == []


def test_a_long_test_the_table_does_not_name_gets_a_quarter_by_its_name(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"quarters": {"t.py::a": 4}}))
    table = QuarterTable.load(path)
    assert table.quarter_of("t.py::a@engines") == 4  # xdist's group suffix is not part of the name
    assert base_id("t.py::a[x]@docker") == "t.py::a[x]"
    quarter = table.quarter_of("t.py::new")
    assert 1 <= quarter <= 4 and all(table.quarter_of("t.py::new") == quarter for _ in range(3))
    path.write_text(json.dumps({"quarters": {"t.py::a": 5}}))
    with pytest.raises(pytest.UsageError, match="quarters must be 1..4"):
        QuarterTable.load(path)


def test_the_committed_table_names_exactly_the_long_tests_and_is_balanced() -> None:
    """Every long test has its quarter in tests/long_quarters.json, and nothing else does (a new long
    test: scripts/balance-long-tier); no quarter holds more than a third of the measured time."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--tier", "long", "-p",
                          "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    collected = {line.strip() for line in out.stdout.splitlines() if "::" in line}
    table = QuarterTable.load()
    assert collected and set(table.quarters) == collected, (sorted(collected - set(table.quarters)),
                                                             sorted(set(table.quarters) - collected))
    loads = [sum(table.durations_s.get(t, 0.0) for t, q in table.quarters.items() if q == n) for n in range(1, 5)]
    assert all(load > 0 for load in loads) and max(loads) <= sum(loads) / 3, loads


def _quarter(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "long-quarter")], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, check=False)


def test_ci_derives_the_quarter_from_head_unless_it_is_forced() -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    derived = _quarter({"SAO_LONG_QUARTER": ""})
    assert derived.returncode == 0, derived.stderr
    assert derived.stdout.split(None, 1) == [str(int(head[:8], 16) % 4 + 1), f"from HEAD {head[:10]}\n"]
    assert _quarter({"SAO_LONG_QUARTER": "3"}).stdout == "3 forced by SAO_LONG_QUARTER\n"
    bad = _quarter({"SAO_LONG_QUARTER": "5"})
    assert bad.returncode == 2 and "must be 1, 2, 3 or 4" in bad.stderr


def test_scripts_test_refuses_a_quarter_out_of_range_before_setting_anything_up() -> None:
    out = subprocess.run(["bash", str(REPO / "scripts" / "test"), "--quarter", "0"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2 and "--quarter takes 1, 2, 3 or 4" in out.stderr


def _report(nodeid: str, when: str, outcome: str, parts: tuple[str, ...], reason: str = "") -> pytest.TestReport:
    longrepr = ("f.py", 1, f"Skipped: {reason}") if outcome == "skipped" else None
    return pytest.TestReport(nodeid, ("f.py", 1, nodeid), {}, outcome, longrepr, when,
                             user_properties=[("sao_part", p) for p in parts])


def test_the_parts_table_counts_one_outcome_per_test_and_says_why_one_skipped(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    table = PartsTable()
    for nodeid, outcomes, parts in [
        ("t::ok", [("setup", "passed"), ("call", "passed"), ("teardown", "passed")], ("docker", "sao-eval")),
        ("t::skip", [("setup", "skipped")], ("docker",)),
        ("t::teardown_failed", [("setup", "passed"), ("call", "passed"), ("teardown", "failed")], ("ray",)),
        ("t::call_failed", [("setup", "passed"), ("call", "failed"), ("teardown", "passed")], ("ray",)),
        ("t::unit", [("setup", "passed"), ("call", "passed")], ()),
    ]:
        for when, outcome in outcomes:
            table.add(_report(nodeid, when, outcome, parts, reason="no Docker daemon answers"))
    rows = table.rows()
    assert (rows["docker"].ran, rows["docker"].passed, rows["docker"].skipped) == (2, 1, 1)
    assert rows["docker"].reasons == {"no Docker daemon answers": 1}
    assert (rows["ray"].ran, rows["ray"].passed, rows["ray"].failed) == (2, 0, 2)
    assert (rows["sao-eval"].ran, rows["sao-eval"].passed) == (1, 1)
    assert rows["vllm-token-route"].ran == 0
    lines = "\n".join(table.lines())
    assert "docker skipped 1: no Docker daemon answers" in lines and "(none selected)" in lines
    missing = table.missing()
    assert "docker: 1 skipped, 0 failed" in missing and "ray: no test passed (2 ran)" in missing
    assert "sao-eval" not in " ".join(missing) and len(missing) == len(PARTS) - 1  # every part but sao-eval
    # the long tier alone holds some parts only: those it did not select are not missing
    assert sorted(p.split(":")[0] for p in table.missing(every_part=False)) == ["docker", "ray"]


def test_an_unknown_part_name_is_a_usage_error() -> None:
    good, bad = FakeItem("t::a", parts=("docker", "ray")), FakeItem("t::b", parts=("dockr",))
    mark_items([good])  # type: ignore[list-item]
    assert good.user_properties == [("sao_part", "docker"), ("sao_part", "ray")]
    with pytest.raises(pytest.UsageError, match="unknown part 'dockr'"):
        mark_items([bad])  # type: ignore[list-item]
