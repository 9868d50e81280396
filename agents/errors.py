"""Errors at the engine and agent boundary.

Error model:
* Retryable transport trouble (connection refused or reset, a timeout, HTTP 5xx) is retried with
  exponential backoff inside the client; only when the retries are spent does it surface, as
  :class:`EngineUnavailableError`.
* A prompt longer than the engine's context is :class:`ContextOverflowError`; the agent loop turns
  it into a *truncated* episode, not a crash.
* A response that does not carry what token-in/token-out needs (token ids, one log-prob per
  token) is :class:`EngineResponseError`; it is not retried, because a server that answers
  malformed once will do it again.
* Any engine error inside an episode makes that episode a recorded failure (``status="failed"``
  with the cause); the run goes on.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base class of this package's errors."""


class EngineError(AgentError):
    """The inference engine failed a request, or could not be started or reached."""


class EngineStartError(EngineError):
    """A managed engine did not become healthy."""


class EngineUnavailableError(EngineError):
    """Connection errors, timeouts or 5xx answers, after every retry."""


class EngineRequestError(EngineError):
    """The engine rejected the request (a 4xx answer other than context overflow)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class EngineResponseError(EngineError):
    """The engine answered, but not with a usable completion (missing token ids, bad JSON, ...)."""


class ContextOverflowError(EngineError):
    """The prompt plus the requested tokens do not fit the engine's context window."""


class RenderError(AgentError):
    """The chat template cannot produce token-exact multi-turn prompts."""
