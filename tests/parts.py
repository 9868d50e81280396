"""The closing table of the real parts: for each part the suite tests against the real thing (vLLM, the
Docker Engine, swebench's harness, peft, torch.distributed, Ray and the two CLIs end to end), how many
of its tests ran, passed, failed and were skipped, and why any was skipped.

A test says which parts it exercises with ``@pytest.mark.part("docker", ...)`` (names: :data:`PARTS`).
The table is built from the test reports (the controller's, under pytest-xdist), so it counts what ran,
not what was meant to. With ``SAO_REQUIRE_PARTS=1`` (CI) the run fails when a part had no passing test,
or had a skipped or failed one: a part that silently skipped (no daemon, no engine) cannot pass CI.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

PARTS: dict[str, str] = {
    "vllm-generation": "vLLM: generation with token ids and log-probs",
    "vllm-weight-sync": "vLLM: weight sync from the learner",
    "vllm-token-route": "vLLM: the token route (/inference/v1/generate)",
    "docker": "a Docker sandbox on the real daemon",
    "swebench": "swebench grading of a genuine instance",
    "peft": "a peft LoRA step",
    "torch.distributed": "two torch.distributed ranks",
    "ray": "a Ray cluster",
    "sao-train": "sao-train, real steps on vLLM",
    "sao-eval": "sao-eval end to end",
    "trackers": "TensorBoard, W&B (offline) and MLflow (SQLite) stores, read back",
}
REQUIRE_ENV = "SAO_REQUIRE_PARTS"
PROPERTY = "sao_part"


def mark_items(items: Iterable[pytest.Item]) -> None:
    """Carry each item's parts in its ``user_properties`` (they reach the controller's reports under
    pytest-xdist, markers' arguments do not); an unknown part name is a usage error."""
    for item in items:
        for mark in item.iter_markers("part"):
            for name in mark.args:
                if name not in PARTS:
                    raise pytest.UsageError(f"{item.nodeid}: unknown part {name!r}; the parts: {', '.join(PARTS)}")
                if (PROPERTY, name) not in item.user_properties:
                    item.user_properties.append((PROPERTY, name))


@dataclass
class PartRow:
    ran: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class PartsTable:
    """Fed every test report (``pytest_runtest_logreport``); one outcome per test."""

    def __init__(self) -> None:
        self._outcomes: dict[str, tuple[tuple[str, ...], str, str]] = {}

    def add(self, report: pytest.TestReport) -> None:
        parts = tuple(v for k, v in report.user_properties if k == PROPERTY)
        if not parts:
            return
        seen = self._outcomes.get(report.nodeid)
        if report.skipped and not hasattr(report, "wasxfail"):
            self._outcomes[report.nodeid] = (parts, "skipped", _reason(report))
        elif report.failed:
            self._outcomes[report.nodeid] = (parts, "failed", "")
        elif report.when == "call" and (seen is None or seen[1] == "passed"):
            self._outcomes[report.nodeid] = (parts, "passed", "")

    def rows(self) -> dict[str, PartRow]:
        rows = {name: PartRow() for name in PARTS}
        for parts, outcome, reason in self._outcomes.values():
            for name in parts:
                row = rows[name]
                row.ran += 1
                setattr(row, outcome, getattr(row, outcome) + 1)
                if reason:
                    row.reasons[reason] = row.reasons.get(reason, 0) + 1
        return rows

    def lines(self) -> list[str]:
        rows = self.rows()
        if not any(r.ran for r in rows.values()):
            return []
        width = max(map(len, PARTS))
        out = [f"real parts: {'part':<{width}}  ran  passed  failed  skipped  what",]
        for name, row in rows.items():
            out.append(f"real parts: {name:<{width}}  {row.ran:>3}  {row.passed:>6}  {row.failed:>6}  {row.skipped:>7}"
                       f"  {PARTS[name]}" + ("" if row.ran else " (none selected)"))
            for reason, n in sorted(row.reasons.items()):
                out.append(f"real parts:   {name} skipped {n}: {reason}")
        return out

    def missing(self, every_part: bool = True) -> list[str]:
        """Why the run fails under ``SAO_REQUIRE_PARTS=1``: a part with a skip or a failure, or with no
        passing test. ``every_part=False`` (the long tier alone, which holds only some parts) lets a part
        that had no test selected pass."""
        problems = []
        for name, row in self.rows().items():
            if row.ran == 0 and not every_part:
                continue
            if row.passed == 0:
                problems.append(f"{name}: no test passed ({row.ran} ran)")
            elif row.skipped or row.failed:
                problems.append(f"{name}: {row.skipped} skipped, {row.failed} failed")
        return problems


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"
