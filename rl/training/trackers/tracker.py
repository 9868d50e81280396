"""The one interface every experiment tracker implements, and the sink that feeds trackers a run's steps.

A :class:`Tracker` (TensorBoard, W&B, MLflow: one module each beside this one) receives the resolved config
once, the scalars of every step, and sample episodes at each held-out evaluation. :class:`TrackerSink` is the
:class:`~sao.rl.training.metrics_log.MetricsSink` that hands a step's finite numbers to every tracker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from sao.agents import Trajectory


class Tracker(Protocol):
    def log_config(self, config: dict[str, Any]) -> None:
        """The run's resolved config (nested, as ``config.json``), as the run's hyperparameters."""

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """One step's scalars (finite numbers only; namespaced keys such as ``loss/policy``)."""

    def log_samples(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        """Held-out episodes of the evaluation at ``step`` (a tracker without tables ignores them)."""

    def close(self) -> None:
        """Flush and end the tracker's run; a second call does nothing."""


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (no bools, None, NaN or strings), as floats."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"algo.name": "sao", "optim.lr": 3e-05, ...}``: numbers, bools and strings kept,
    None as ``"null"``, lists as their ``str``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif value is None:
            out[name] = "null"
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out


def sample_row(step: int, trajectory: Trajectory) -> list[Any]:
    """One held-out episode as a table row (:data:`SAMPLE_COLUMNS`): its task, outcome, prompt and answer."""
    messages = trajectory.messages
    prompt = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    answer = next((m.get("content") for m in reversed(messages) if m.get("role") == "assistant"), "")
    return [step, trajectory.task_id, trajectory.status, trajectory.correct, float(trajectory.reward),
            str(prompt or ""), str(answer or ""), trajectory.error or ""]


SAMPLE_COLUMNS = ["step", "task_id", "status", "correct", "reward", "prompt", "response", "error"]


class TrackerSink:
    """Each step's metrics to every tracker, as :func:`scalars`; closes them at the end."""

    def __init__(self, trackers: Sequence[Tracker]):
        self.trackers = list(trackers)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        numbers = scalars(metrics)
        for tracker in self.trackers:
            tracker.log_scalars(step, numbers)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
