"""Benchmark evaluation: ``sao-eval`` and the functions behind it."""

from .metrics import mean_pass_at_k, pass_at_k
from .runner import EvalConfig, EvalError, evaluate

__all__ = ["EvalConfig", "EvalError", "evaluate", "mean_pass_at_k", "pass_at_k"]
