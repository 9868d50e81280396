"""``sao-eval --speculative suffix``: an evaluation on a local vLLM that speculates, with the engine's
counters over the run in the summary.

The runner (:func:`~sao.evals.runner.evaluate`) starts a plain engine itself. Here the engine is
started with the speculative flag (:class:`~sao.agents.speculative.SpeculativeConfig`), the
evaluation runs against it in tokens mode, and ``summary.json`` gains what the engine's ``/metrics``
counted between the first and the last episode:

* ``spec_acceptance``: accepted / proposed draft tokens;
* ``spec_accepted_per_draft``: mean accepted tokens per draft;
* ``prefix_cache_hit_rate``: prompt tokens served from the prefix cache / prompt tokens looked up;
* ``engine``: the counts behind them (:meth:`~sao.agents.engine_metrics.EngineMetrics.summary`).

``wall_s`` and ``rollout_s`` exclude the engine's start-up here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sao.agents import Trajectory
from sao.agents.endpoint import open_endpoint
from sao.agents.engine_metrics import read_metrics
from sao.agents.speculative import SpeculativeConfig

from .runner import EvalConfig, EvalError, evaluate, plan, prepare_output


def evaluate_speculative(
    cfg: EvalConfig,
    speculative: SpeculativeConfig,
    *,
    progress: Callable[[int, int], Callable[[Trajectory], None]] | None = None,
) -> dict[str, Any]:
    """:func:`evaluate` on a local vLLM started with ``speculative``; the summary adds its counters."""
    if cfg.base_url is not None:
        raise EvalError("--speculative starts a local vLLM with it; a server at --base-url was started with "
                        "its own --speculative-config")
    if cfg.agent != "llm" or cfg.grade_only is not None:
        raise EvalError("--speculative needs the model to play (--agent llm, no --grade-only)")
    plan(cfg)  # a bad benchmark or dataset fails before the engine's minute of start-up
    prepare_output(cfg)  # so does an output folder that needs --resume
    with open_endpoint(cfg.model, tokenizer=cfg.tokenizer, max_model_len=cfg.max_model_len,
                       log_path=cfg.output / "vllm.log", speculative=speculative) as endpoint:
        root = endpoint.base_url.removesuffix("/v1")
        before = read_metrics(root)
        on_engine = replace(cfg, base_url=endpoint.base_url, tokenizer=endpoint.tokenizer, endpoint_mode="tokens")
        summary = evaluate(on_engine, progress=progress)
        used = read_metrics(root).since(before)
    summary |= {"speculative": speculative.method, "spec_acceptance": used.spec_acceptance,
                "spec_accepted_per_draft": used.spec_accepted_per_draft,
                "prefix_cache_hit_rate": used.prefix_cache_hit_rate, "engine": used.summary()}
    (cfg.output / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
