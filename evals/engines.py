"""The engines an evaluation plays on, and what they did: one endpoint or ``--replicas`` local vLLMs.

:func:`open_engines` yields the endpoints (none for scripted agents and ``--grade-only``; one managed
or external endpoint; or ``--replicas N`` managed engines, :func:`sao.agents.engine.fleet.open_replicas`).
:func:`measured` runs the episodes between two readings of every engine's ``/metrics``
(:class:`~sao.agents.engine.meter.EngineMeter`, summed over the replicas; a read that fails leaves
that replica out and never fails the run; a replica restarted mid-run counts from its restart) and
gives what ``summary.json`` adds: under ``--speculative`` the draft acceptance, with several
replicas the prefix-cache hit rate, the counters behind them and what the router did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from sao.agents.clients import Endpoint, open_endpoint
from sao.agents.engine import EngineClient, EngineMeter, EngineMetrics, SpeculativeConfig, open_replicas

if TYPE_CHECKING:
    from .runner import EvalConfig

# summary.json keys that come from the engines: a --resume with nothing left to run keeps them
ENGINE_KEYS = ("speculative", "spec_acceptance", "spec_accepted_per_draft", "prefix_cache_hit_rate", "engine",
               "replicas", "router", "routing", "max_model_len")


@contextlib.contextmanager
def open_engines(cfg: EvalConfig) -> Iterator[list[Endpoint]]:
    """The endpoints the model plays on (module doc), stopped on exit when managed."""
    if not cfg.model_plays:
        yield []
    elif cfg.replicas > 1:
        with open_replicas(cfg.model, cfg.replicas, max_model_len=cfg.max_model_len, log_dir=cfg.output,
                           speculative=cfg.speculative, tokenizer=cfg.tokenizer) as endpoints:
            yield endpoints
    else:
        with open_endpoint(cfg.model, base_url=cfg.base_url, api_key=cfg.api_key, tokenizer=cfg.tokenizer,
                           max_model_len=cfg.max_model_len, log_path=cfg.output / "vllm.log",
                           mode=cfg.endpoint_mode, speculative=cfg.speculative) as endpoint:
            yield [endpoint]


async def measured(cfg: EvalConfig, endpoints: list[Endpoint],
                   run: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any] | None:
    """``await run()`` (the episodes; it returns what the router did) between two readings of the
    engines' counters; the summary's engine keys, or None when this run reports none (no
    ``--speculative``, one replica)."""
    if not endpoints or not (cfg.speculative.enabled or len(endpoints) > 1):
        await run()
        return None
    async with contextlib.AsyncExitStack() as stack:
        controls = [await stack.enter_async_context(EngineClient(root(e), api_key=e.api_key)) for e in endpoints]
        meter = EngineMeter(controls)
        await meter.start()
        routing = await run()
        used = await meter.window()
    out = speculative_summary(cfg.speculative, used) if cfg.speculative.enabled else {}
    if len(endpoints) > 1:
        out |= {"replicas": len(endpoints), "router": cfg.router, "routing": routing, **engine_counts(used)}
    return out


def root(endpoint: Endpoint) -> str:
    return endpoint.base_url.removesuffix("/v1")


def engine_counts(used: EngineMetrics | None) -> dict[str, Any]:
    """Prompt tokens served from the prefix cache / looked up, and the counters behind it (None: not read)."""
    return {"prefix_cache_hit_rate": used.prefix_cache_hit_rate if used else None,
            "engine": used.summary() if used else None}


def speculative_summary(speculative: SpeculativeConfig, used: EngineMetrics | None) -> dict[str, Any]:
    """What ``summary.json`` adds under ``--speculative``: the engine's ``/metrics`` counted over this
    invocation's episodes (accepted / proposed draft tokens, accepted tokens per draft, prompt tokens
    served from the prefix cache / looked up, and the counts behind them)."""
    return {"speculative": speculative.method, "spec_acceptance": used.spec_acceptance if used else None,
            "spec_accepted_per_draft": used.spec_accepted_per_draft if used else None, **engine_counts(used)}
