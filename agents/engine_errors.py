"""Errors of the managed vLLM server and its control client (:mod:`sao.agents.engine`).

Kept apart from :mod:`sao.agents.errors` until the two are merged. Both classes subclass their
namesakes there, so ``except sao.agents.errors.EngineError`` (or ``EngineStartError``) catches
them already.
"""

from __future__ import annotations

from pathlib import Path

from . import errors as _errors


class EngineError(_errors.EngineError):
    """A control request to the engine failed: HTTP ``status_code`` (None: no answer) and ``body``."""

    def __init__(self, message: str, *, status_code: int | None = None, body: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class EngineStartError(EngineError, _errors.EngineStartError):
    """The managed server exited or did not become healthy; the message ends with the log's tail."""

    def __init__(self, message: str, *, log_path: Path | None = None, log_tail: str = ""):
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail
