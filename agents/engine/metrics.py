"""What a vLLM server says about itself on its Prometheus endpoint (``GET /metrics``), as a typed record.

:func:`combined` adds several servers' readings up (replicas); :mod:`.meter` takes their growth
window by window.

Counters (totals since the server started; :meth:`EngineMetrics.since` gives one window's share):
* speculative decoding: drafts, draft tokens and accepted draft tokens
  (``vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}``), zero when it is off;
* the prefix (KV) cache: queried and hit prompt tokens (``vllm:prefix_cache_{queries,hits}``);
* generated and prompt tokens (``vllm:{generation,prompt}_tokens``).
Gauges (the moment it was read): running and waiting requests, KV-cache usage (0..1).

Prometheus' text format writes a counter ``c`` as ``c_total`` and one sample per label set (one per
engine core, for instance); samples are summed over labels, but KV-cache usage is averaged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

_COUNTERS = {
    "spec_drafts": "vllm:spec_decode_num_drafts",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "generation_tokens": "vllm:generation_tokens",
    "prompt_tokens": "vllm:prompt_tokens",
}
_GAUGES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",  # a fraction in vLLM 0.32, despite the name
}


@dataclass(frozen=True)
class EngineMetrics:
    """One reading of a server's ``/metrics``. Counters are token or draft counts; gauges are as read."""

    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    generation_tokens: int = 0
    prompt_tokens: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0

    @property
    def spec_acceptance(self) -> float | None:
        """Accepted / proposed draft tokens; None when nothing was drafted (speculation off or idle)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else None

    @property
    def spec_accepted_per_draft(self) -> float | None:
        """Mean accepted tokens per draft; each verification step also yields one token of its own."""
        return self.spec_accepted_tokens / self.spec_drafts if self.spec_drafts else None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache / prompt tokens looked up; None before any lookup."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None

    def since(self, earlier: EngineMetrics) -> EngineMetrics:
        """The counters' growth from ``earlier`` to this reading; the gauges stay this reading's."""
        grown = {name: getattr(self, name) - getattr(earlier, name) for name in _COUNTERS}
        return EngineMetrics(**grown, running=self.running, waiting=self.waiting, kv_cache_usage=self.kv_cache_usage)

    def summary(self) -> dict[str, float | int | None]:
        """Flat numbers for a summary or a metrics line: the fields and the three rates."""
        out: dict[str, float | int | None] = {f.name: getattr(self, f.name) for f in fields(self)}
        out |= {"spec_acceptance": self.spec_acceptance, "spec_accepted_per_draft": self.spec_accepted_per_draft,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate}
        return out


def combined(readings: Sequence[EngineMetrics]) -> EngineMetrics:
    """Several engines as one: counters and request counts summed, KV-cache usage averaged (an empty
    sequence gives the zero reading)."""
    if not readings:
        return EngineMetrics()
    total = {name: sum(getattr(r, name) for r in readings) for name in (*_COUNTERS, "running", "waiting")}
    return EngineMetrics(**total, kv_cache_usage=sum(r.kv_cache_usage for r in readings) / len(readings))


def metric_totals(text: str) -> tuple[dict[str, float], dict[str, int]]:
    """Each metric's samples in Prometheus text, summed over their labels, and how many samples each had."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0].strip()
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            totals[name] = totals.get(name, 0.0) + number
            counts[name] = counts.get(name, 0) + 1
    return totals, counts


def counter_total(totals: dict[str, float], name: str) -> int:
    """Counter ``name`` from :func:`metric_totals` (exported as ``name_total``, or bare); 0 when absent."""
    return int(totals.get(f"{name}_total", totals.get(name, 0.0)))


def parse_metrics(text: str) -> EngineMetrics:
    """The record from Prometheus text; metrics the server does not export read as 0."""
    totals, counts = metric_totals(text)
    kv = _GAUGES["kv_cache_usage"]  # a fraction per engine core: averaged, not summed
    counters = {field: counter_total(totals, name) for field, name in _COUNTERS.items()}
    return EngineMetrics(**counters, running=int(totals.get(_GAUGES["running"], 0.0)),
                         waiting=int(totals.get(_GAUGES["waiting"], 0.0)),
                         kv_cache_usage=totals.get(kv, 0.0) / max(counts.get(kv, 1), 1))


def read_metrics(root_url: str, *, timeout_s: float = 10.0) -> EngineMetrics:
    """One blocking read of ``ROOT/metrics`` (for scripts and CLIs; async code has ``EngineClient.metrics``)."""
    import httpx

    from ..errors import EngineError

    try:
        resp = httpx.get(root_url.rstrip("/") + "/metrics", timeout=timeout_s, trust_env=False)
        resp.raise_for_status()
    except httpx.HTTPError as err:
        raise EngineError(f"GET {root_url}/metrics: {type(err).__name__}: {err}") from err
    return parse_metrics(resp.text)
