"""rl/'s errors, in one place: what each means and who raises it.

A broken configuration fails at once with :class:`ConfigError`, whose message says what to change
(``sao-train`` exits 2 on it). A bad rollout is data, not a crash: a failed episode is recorded with
its cause and the run goes on; the errors below are for what cannot go on.

This module imports nothing, so the pure schedulers and the simulator (no torch) may use it.
The old module paths re-export their names (``sao.rl.config.ConfigError``,
``sao.rl.rollout.schedulers.LedgerError``, ...); the definitions are these.
"""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError", "LedgerError", "ReportError", "RolloutError", "RolloutFailing",
           "ScheduleError", "SimError", "TrainError"]


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message says what to change. Raised by the
    training config's checks (:func:`sao.rl.config.validate`), the algorithms, the rollout schedulers'
    and the simulator's configs, the cluster and learner launch checks."""


class ScheduleError(ValueError):
    """A schedule configuration or checkpoint the run cannot use; the message says what to change
    (:mod:`sao.rl.prompts.curriculum`)."""


class RolloutError(Exception):
    """Base of the rollout schedulers' and the simulator's errors."""


class LedgerError(RolloutError, AssertionError):
    """An accounting invariant broke: a trajectory was lost, counted twice, or moved illegally."""


class SimError(RolloutError):
    """The simulation could not go on: a scheduler stalled or contradicted the engines."""


class RolloutFailing(RuntimeError):
    """``limit`` attempts in a row failed: the rollout cannot produce a batch
    (:class:`sao.rl.rollout.failure_streak.FailureStreak`)."""


class TrainError(RuntimeError):
    """The run cannot go on (every trajectory of a batch failed, a run folder in the way, ...)."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or none that exists can be read; the message is one line."""


class ReportError(Exception):
    """``sao-report`` cannot read the run it was given."""
