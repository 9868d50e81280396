"""Metric sinks: one dict of namespaced scalars per step, to JSONL and the rich console (the experiment
trackers, TensorBoard among them, are :mod:`sao.rl.training.trackers`).

Every line of ``metrics.jsonl`` carries :data:`REQUIRED_KEYS`; a key that does not apply to the
algorithm is ``null`` (``loss/value`` without a critic, ``dis/mask_frac`` without DIS), never
missing, so runs of different algorithms read the same way. Non-finite floats are written as
``null`` too (JSON has no NaN). On resume the sinks drop what was logged after the checkpoint
(those steps run again), so the file never holds a step twice.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Protocol

REQUIRED_KEYS = ("step", "loss/policy", "loss/value", "dis/mask_frac", "reward/mean", "engine/weight_version",
                 "perf/sync_s")


class MetricsSink(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def complete(step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` with ``step`` first and every required key present (``None`` where absent)."""
    row: dict[str, Any] = {"step": step}
    row.update({k: None for k in REQUIRED_KEYS[1:]})
    row.update({k: _clean(v) for k, v in metrics.items() if k != "step"})
    return row


def read_jsonl(path: Path, *, missing_ok: bool = True, warn: bool = False) -> list[dict[str, Any]]:
    """The JSON objects of a run's JSON-lines file, in order. A torn line (a crash mid-write) or a line that
    is not a JSON object is skipped, with a warning on stderr when ``warn``. A missing file is no rows, or
    ``FileNotFoundError`` unless ``missing_ok``."""
    path = Path(path)
    if not path.is_file():
        if missing_ok:
            return []
        raise FileNotFoundError(path)
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif warn and line.strip():
            print(f"warning: {path}:{n}: skipping a line that is not a JSON object", file=sys.stderr)
    return rows


def rewind_jsonl(path: Path, last_step: int, key: str = "step") -> int:
    """Keep the lines of ``path`` whose ``key`` is <= ``last_step`` (and drop a torn last line).
    Rewrites atomically; returns the number of lines dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        value = record.get(key) if isinstance(record, dict) else None
        for nested in ("rollout", "info"):  # a trajectory's rollout.train_step (info.train_step before)
            if value is None and isinstance(record, dict):
                value = (record.get(nested) or {}).get(key)
        if value is not None and value > last_step:
            dropped += 1
        else:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return dropped


class JsonlSink:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._fh = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._fh.write(json.dumps(complete(step, metrics), separators=(",", ":")) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


class ConsoleSink:
    """One rich line per step with the figures a person watches."""

    SHOWN = (("reward/mean", "reward", "{:.3f}"), ("reward/accuracy", "acc", "{:.3f}"),
             ("loss/policy", "L_pi", "{:+.4f}"), ("loss/value", "L_v", "{:.4f}"), ("dis/mask_frac", "mask", "{:.3f}"),
             ("value/explained_var", "EV", "{:+.2f}"), ("rollout/logprob_gap", "gap", "{:.3f}"),
             ("perf/sync_s", "sync", "{:.2f}s"), ("perf/step_s", "step", "{:.1f}s"))

    def __init__(self, total_steps: int, console: Any = None):
        from rich.console import Console

        self.total = total_steps
        self.console = console or Console(stderr=True)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        parts = [f"[bold]step {step}/{self.total}[/bold]"]
        for key, label, fmt in self.SHOWN:
            value = metrics.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                parts.append(f"{label} {fmt.format(value)}")
        self.console.print("  ".join(parts), highlight=False)

    def close(self) -> None:
        pass


class MultiSink:
    def __init__(self, sinks: list[MetricsSink]):
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
