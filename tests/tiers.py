"""The suite's tiers (``scripts/test``; docs/testing.md).

- **default** (``bash scripts/test``): every test not marked ``long``: the unit tests and at least one
  real test of each real part (:mod:`tests.parts` prints their table).
- **long** (``bash scripts/test --long``): the tests marked ``long``: fault injection, the 2-node Ray run,
  the default configuration's memory bound, the soak test, every genuine SWE-bench instance, and the
  other real tests of a minute or more that the default tier does not need.
- **CI** (``.ci/run``): the default tier plus one quarter of the long tier. Each long test belongs to a
  quarter by the committed table :data:`TABLE` (``scripts/balance-long-tier`` makes it from measured
  durations, balanced); the quarter comes from HEAD's hash, or ``SAO_LONG_QUARTER``.

pytest's options: ``--tier default|long|all`` (plain ``pytest`` runs all), ``--long-quarter N`` (the
default tier with the long tests of quarter N, or only quarter N of the long tier), and
``--alone include|exclude|only`` (``scripts/test`` runs the tests marked ``alone`` in a call of their
own). A long test that the table does not name falls into a quarter by its name's hash, and the
summary names it, so that a new long test runs somewhere before the table is made again.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

TABLE = Path(__file__).with_name("long_quarters.json")
QUARTERS = 4
TIERS = ("default", "long", "all")
ALONE = ("include", "exclude", "only")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("sao", "sao's test tiers (tests/tiers.py)")
    group.addoption("--tier", choices=TIERS, default="all",
                    help="default: the tests not marked long; long: those marked long; all (the default): both")
    group.addoption("--long-quarter", type=int, choices=range(1, QUARTERS + 1), default=None, metavar="N",
                    help="with --tier default, add the long tests of quarter N (what CI runs); with --tier long, "
                         "run only quarter N")
    group.addoption("--alone", choices=ALONE, default="include",
                    help="the tests marked alone: include them (skipped beside session engines), exclude them, "
                         "or run only them")


def base_id(nodeid: str) -> str:
    """A node id without the ``@group`` that pytest-xdist's ``--dist loadgroup`` appends."""
    return nodeid.split("@", 1)[0]


@dataclass(frozen=True)
class QuarterTable:
    """Which quarter of the long tier each long test belongs to, and the durations it was balanced on."""

    quarters: dict[str, int]
    durations_s: dict[str, float]
    measured: str

    @classmethod
    def load(cls, path: Path = TABLE) -> QuarterTable:
        if not path.exists():
            return cls({}, {}, "")
        data = json.loads(path.read_text())
        quarters = {str(k): int(v) for k, v in data["quarters"].items()}
        bad = {k: v for k, v in quarters.items() if not 1 <= v <= QUARTERS}
        if bad:
            raise pytest.UsageError(f"{path}: quarters must be 1..{QUARTERS}: {bad}")
        return cls(quarters, {str(k): float(v) for k, v in data.get("durations_s", {}).items()},
                   str(data.get("measured", "")))

    def quarter_of(self, nodeid: str) -> int:
        """The table's quarter, or one by the id's hash for a test the table does not name."""
        nodeid = base_id(nodeid)
        if nodeid in self.quarters:
            return self.quarters[nodeid]
        return zlib.crc32(nodeid.encode()) % QUARTERS + 1


def is_long(item: pytest.Item) -> bool:
    return item.get_closest_marker("long") is not None


def select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect what ``--tier``, ``--long-quarter`` and ``--alone`` leave out (in place, as pytest's ``-m`` does)."""
    tier, quarter, alone = config.getoption("tier"), config.getoption("long_quarter"), config.getoption("alone")
    table = QuarterTable.load() if quarter is not None else None

    def kept(item: pytest.Item) -> bool:
        if alone == "exclude" and item.get_closest_marker("alone"):
            return False
        if alone == "only" and not item.get_closest_marker("alone"):
            return False
        if not is_long(item):
            return tier != "long"
        if tier == "default" and quarter is None:
            return False
        if table is not None:
            return table.quarter_of(item.nodeid) == quarter
        return True

    keep = [item for item in items if kept(item)]
    dropped = [item for item in items if not kept(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def summary(config: pytest.Config, long_ran: list[str]) -> list[str]:
    """What the tiers add to the run's closing lines: the tier and quarter, and those of the long tests
    that ran (``long_ran``, node ids) that the table does not name (``scripts/balance-long-tier``)."""
    tier, quarter = config.getoption("tier"), config.getoption("long_quarter")
    lines = []
    if tier != "all" or quarter is not None:
        what = {"default": "the default tier", "long": "the long tier", "all": "every tier"}[tier]
        if quarter is not None:
            what += (f" and quarter {quarter} of {QUARTERS} of the long tier" if tier == "default"
                     else f", quarter {quarter} of {QUARTERS}")
        lines.append(f"tiers: {what} ({TABLE.name})")
    listed = QuarterTable.load().quarters
    unlisted = sorted({base_id(n) for n in long_ran} - set(listed))
    if unlisted:
        lines.append(f"tiers: {len(unlisted)} long tests are not in {TABLE.name} and were given a quarter by "
                     f"their name's hash (e.g. {unlisted[0]}); make the table again: scripts/balance-long-tier")
    return lines
