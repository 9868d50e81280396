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

from pathlib import Path


class AgentError(Exception):
    """Base class of this package's errors."""


class EngineError(AgentError):
    """The inference engine failed a request, or could not be started or reached.

    ``status_code`` is the HTTP status (None: no answer, or not an HTTP failure); ``body`` the answer's text.
    """

    def __init__(self, message: str, *, status_code: int | None = None, body: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class EngineStartError(EngineError):
    """A managed engine exited or did not become healthy; the message ends with the log's tail."""

    def __init__(self, message: str, *, log_path: Path | None = None, log_tail: str = ""):
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail


class EngineUnavailableError(EngineError):
    """Connection errors, timeouts or 5xx answers, after every retry."""


class EngineRequestError(EngineError):
    """The engine rejected the request (a 4xx answer other than context overflow)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message, status_code=status)
        self.status = status


class EngineResponseError(EngineError):
    """The engine answered, but not with a usable completion (missing token ids, bad JSON, ...)."""


class ContextOverflowError(EngineError):
    """The prompt plus the requested tokens do not fit the engine's context window."""


class RenderError(AgentError):
    """The chat template cannot produce token-exact multi-turn prompts."""
