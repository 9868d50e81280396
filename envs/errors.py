"""Errors raised at the environment boundary.

Error model: a *broken input* (a dataset row without its answer, an unknown environment name,
bad constructor arguments) fails at once with a message saying what to change. A *bad rollout*
(an unparseable answer, a malformed tool call) is not an error: it is recorded in the episode's
``info`` and graded as incorrect.
"""

from __future__ import annotations


class EnvError(Exception):
    """Base class of this package's errors."""


class DatasetError(EnvError):
    """A dataset file or hub dataset cannot be read, or one of its rows is malformed."""


class TaskError(EnvError):
    """A task id that the environment does not have."""


class UnknownEnvError(EnvError, KeyError):
    """An environment name that is neither a registered short name nor a gymnasium id."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])
