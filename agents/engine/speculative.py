"""Speculative decoding on a managed vLLM: which method, and the flag that starts vLLM with it.

``suffix`` is SuffixDecoding (METHOD.md section 3, WAR). Drafts come from suffix trees, one over the
request's own prompt and one global tree over earlier responses (``max_cached_requests`` of them), so
there is no draft model. The target model verifies each draft, and rejection sampling keeps its
distribution: the sampled tokens, and the log-probs the engine reports for them, are the target
model's (tests/test_speculative_vllm.py checks the log-probs). vLLM's implementation needs the
``arctic-inference`` package (the ``cpu`` extra).

The global tree lives as long as the server: in vLLM 0.32 it belongs to the model runner's proposer,
which neither ``reload_weights`` nor ``reset_prefix_cache`` touches (read from its source).

Load-aware switching: ``schedule`` is vLLM 0.32's per-batch-size schedule
(``num_speculative_tokens_per_batch_size``): each step, the number of requests the engine schedules
picks the draft length (0: none). Its suffix proposer asserted a fixed draft length, and the engine
died as soon as a batch crossed a threshold; :mod:`sao.agents.engine.vllm_plugins.suffix_step_length` (a vLLM general plugin
this package installs) makes it honour the step's length. :func:`load_aware` builds the engine's
setting from a calibration (benchmarks/war.py: the largest concurrency up to which suffix decoding never
lost): a schedule, or plain decoding when it never won.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sao.hints import did_you_mean

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
    # load-aware: ((first, last, draft tokens), ...) by the number of requests scheduled in a step, the
    # first range from 1, in order; past the last range its length holds. (): always num_tokens
    schedule: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            hint = did_you_mean(str(self.method), SPECULATIVE_METHODS, clause=True)
            raise ValueError(f"speculative method must be one of {SPECULATIVE_METHODS}, not {self.method!r}{hint}")
        value = self.num_tokens
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"speculative num_tokens must be a whole number >= 1 or None, not {value!r}")
        if self.max_tree_depth < 1 or self.max_cached_requests < 0:
            raise ValueError("speculative max_tree_depth must be >= 1 and max_cached_requests >= 0")
        object.__setattr__(self, "schedule", check_schedule(self.schedule))
        if self.schedule and not self.enabled:
            raise ValueError("a speculative schedule needs a speculative method (it sets draft lengths)")

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
        if self.schedule:
            out["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.schedule]
        return out

    def server_args(self) -> tuple[str, ...]:
        """Arguments for ``vllm.entrypoints.openai.api_server``: empty when off."""
        config = self.vllm_config()
        return () if config is None else ("--speculative-config", json.dumps(config, separators=(",", ":")))


def check_schedule(schedule: Any) -> tuple[tuple[int, int, int], ...]:
    """``schedule`` as a tuple of ``(first, last, draft tokens)`` ranges of scheduled requests, or
    ValueError: whole numbers, the first range from 1, each after the one before (a gap keeps the
    length before it, as in vLLM), lengths >= 0."""
    if schedule is None:
        return ()
    out: list[tuple[int, int, int]] = []
    for entry in schedule:
        if (not isinstance(entry, list | tuple) or len(entry) != 3
                or any(isinstance(x, bool) or not isinstance(x, int) for x in entry)):
            raise ValueError(f"a speculative schedule entry is (first, last, draft tokens), whole numbers; not {entry!r}")
        first, last, k = entry
        if (not out and first != 1) or (out and first <= out[-1][1]):
            raise ValueError(f"speculative schedule ranges start at 1 and follow one another: {entry!r} after "
                             f"{out[-1] if out else 'nothing'}")
        if last < first or k < 0:
            raise ValueError(f"a speculative schedule range needs first <= last and draft tokens >= 0: {entry!r}")
        out.append((first, last, k))
    return tuple(out)


def parse_schedule(text: str) -> tuple[tuple[int, int, int], ...]:
    """``"1-4:24,5-:0"`` -> ``((1, 4, 24), (5, 5, 0))``: FIRST-LAST:TOKENS ranges; an open last range
    (``5-``) holds from FIRST on (the last range's length holds past it)."""
    out = []
    for part in text.split(","):
        try:
            span, k = part.strip().split(":")
            first, _, last = span.partition("-")
            out.append((int(first), int(last) if last else int(first), int(k)))
        except ValueError:
            raise ValueError(f"speculative schedule {text!r}: write FIRST-LAST:TOKENS ranges, e.g. 1-4:24,5-:0") from None
    return check_schedule(out)


def load_aware(wins_up_to: int | None, num_tokens: int) -> SpeculativeConfig:
    """The engine a calibration gives: suffix decoding with ``num_tokens`` drafts while at most
    ``wins_up_to`` requests run (the largest measured concurrency at which speculation never lost to plain
    decoding), none above. ``None`` (it lost at every measured load): plain decoding, no speculative method
    at all. A suffix engine told to draft nothing is not plain: vLLM 0.32 turns async scheduling off for
    suffix decoding and the proposer still updates its trees every step, and it ran at 0.73x to 0.85x of
    plain (benchmarks/war.py, temperature 1, 2026-12-04)."""
    if wins_up_to is None or wins_up_to < 1:
        return SpeculativeConfig()
    return SpeculativeConfig("suffix", schedule=((1, wins_up_to, num_tokens), (wins_up_to + 1, wins_up_to + 1, 0)))


def schedule_flag(config: SpeculativeConfig) -> str:
    """How ``sao-eval`` takes ``config``: ``--speculative none``, or ``--speculative suffix`` with its
    ``--spec-schedule FIRST-LAST:TOKENS,...`` (the last range open)."""
    if not config.enabled:
        return "--speculative none"
    if not config.schedule:
        return f"--speculative {config.method}"
    *head, (last_first, _, last_k) = config.schedule
    ranges = [*(f"{a}-{b}:{k}" for a, b, k in head), f"{last_first}-:{last_k}"]
    return f"--speculative {config.method} --spec-schedule {','.join(ranges)}"
