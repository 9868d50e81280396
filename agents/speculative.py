"""Speculative decoding on a managed vLLM: which method, and the flag that starts vLLM with it.

``suffix`` is SuffixDecoding (METHOD.md section 3, WAR). Drafts come from suffix trees, one over the
request's own prompt and one global tree over earlier responses (``max_cached_requests`` of them), so
there is no draft model. The target model verifies each draft, and rejection sampling keeps its
distribution: the sampled tokens, and the log-probs the engine reports for them, are the target
model's (tests/test_speculative_vllm.py checks the log-probs). vLLM's implementation needs the
``arctic-inference`` package (the ``cpu`` extra).

The global tree lives as long as the server: in vLLM 0.32 it belongs to the model runner's proposer,
which neither ``reload_weights`` nor ``reset_prefix_cache`` touches (read from its source).

Load-aware switching is not offered: vLLM 0.32's per-batch-size schedule
(``num_speculative_tokens_per_batch_size``) starts, but the suffix proposer asserts a fixed draft
length, and the engine died as soon as a batch crossed the threshold (benchmarks/war.py, measured).
A switch must be the project's own (route, or restart without drafting), from a calibration.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

SPECULATIVE_METHODS = ("none", "suffix")

@dataclass(frozen=True)
class SpeculativeConfig:
    """How a managed vLLM speculates. ``method="none"`` (the default) adds nothing to its command."""

    method: str = "none"
    num_tokens: int | None = None  # most draft tokens per step; None: vLLM's default for suffix (max_tree_depth)
    max_tree_depth: int = 24  # prefix match + draft length, at most
    max_cached_requests: int = 10000  # responses in the global tree (FIFO); 0: prompt trees only
    max_spec_factor: float = 1.0  # draft length <= factor * matched prefix length
    min_token_prob: float = 0.1  # draft only tokens whose estimated probability is at least this

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            close = difflib.get_close_matches(str(self.method), SPECULATIVE_METHODS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"speculative method must be one of {SPECULATIVE_METHODS}, not {self.method!r}{hint}")
        value = self.num_tokens
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"speculative num_tokens must be a whole number >= 1 or None, not {value!r}")
        if self.max_tree_depth < 1 or self.max_cached_requests < 0:
            raise ValueError("speculative max_tree_depth must be >= 1 and max_cached_requests >= 0")

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    def vllm_config(self) -> dict[str, Any] | None:
        """The value of vLLM's ``--speculative-config`` (vllm/config/speculative.py), None when off."""
        if not self.enabled:
            return None
        out: dict[str, Any] = {
            "method": self.method,
            "suffix_decoding_max_tree_depth": self.max_tree_depth,
            "suffix_decoding_max_cached_requests": self.max_cached_requests,
            "suffix_decoding_max_spec_factor": self.max_spec_factor,
            "suffix_decoding_min_token_prob": self.min_token_prob,
        }
        if self.num_tokens is not None:
            out["num_speculative_tokens"] = self.num_tokens
        return out

    def server_args(self) -> tuple[str, ...]:
        """Arguments for ``vllm.entrypoints.openai.api_server``: empty when off."""
        config = self.vllm_config()
        return () if config is None else ("--speculative-config", json.dumps(config, separators=(",", ":")))
