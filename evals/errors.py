"""Errors of ``sao-eval``: a configuration or output-folder problem that the user must fix (exit status 2)."""

from __future__ import annotations


class EvalError(Exception):
    """A configuration or output-folder problem that the user must fix; the message says what to change."""
