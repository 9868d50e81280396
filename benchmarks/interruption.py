"""What a weight update costs the requests it lands on (issue 11: partial rollouts on the token route).

    .venv/bin/python benchmarks/interruption.py [--requests 32] [--concurrency 16] [--max-tokens 192]
                                                [--every 8] [--out runs/interruption]

The rollout driver loads each version into a replica with ``sao.rl.weights.load.load_weights``: pause in
vLLM's ``keep`` mode (the running requests wait), reload, relabel the version, reset the prefix cache,
resume; the requests then continue on the new weights, and the token route
(``POST /inference/v1/generate``) reports each output token's version. That is the partial rollout of
METHOD.md: no request is aborted or restarted. What it costs depends on the KV cache:
- ``keep`` (the default, ``rollout.keep_kv=false``): vLLM clears its KV cache at the pause, which preempts
  every running request; after the resume each one computes its prompt and every token it had generated
  again, on the new weights, before its next token;
- ``keep-kv`` (``rollout.keep_kv=true``): the pause keeps their KV blocks, computed with the old weights,
  and they go on at once (PipelineRL's in-flight updates).

One managed vLLM (the bundled model, fp32, the token route) answers the same requests three times, side
by side: ``--requests`` token-route requests, ``--concurrency`` in flight, each generating exactly
``--max-tokens`` tokens (``ignore_eos``) at temperature 1: ``none`` (no update), then ``keep`` and
``keep-kv`` (the same folder reloaded as a new version every ``--every`` seconds while requests run).
Printed: completion tokens/s of each arm and its ratio to ``none``, the updates and their seconds (pause
to resume), the requests whose tokens span two versions or more, vLLM's preemptions, and the cost of one
update in seconds of the arm's wall time over ``none``'s. The machine is shared and has 2 cores: the
ratios from one run are the figures to read, not the absolute speeds.

2026-12-03, defaults: none 40.1 s (153 tokens/s); keep 78.4 s, 0.51x, 8 updates of 0.78 s each from
pause to resume, 127 preemptions (16 requests x 8 updates), 4.79 s of wall time per update; keep-kv
43.9 s, 0.91x, 5 updates of 0.54 s, no preemption, 0.75 s per update. Every request spanned 2+ versions
in both. So an update's cost is its recomputation, which grows with the tokens in flight: an earlier run
with an update every 4 s fell from ~130 to 5 tokens/s as the 16 requests' contexts grew, until most of
each 4 s went to computing them again (vLLM counts that neither as prompt nor as generation throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from sao.agents.clients.generate import generate_base_url
from sao.agents.engine.control import EngineClient
from sao.agents.engine.metrics import counter_total, metric_totals
from sao.agents.engine.server import VLLMServer, VLLMServerConfig
from sao.agents.interrupts import sigterm_as_interrupt
from sao.agents.models.prepare import ensure_model
from sao.rl.weights.load import load_weights

TOPICS = ("a lighthouse keeper", "a river town", "a lost map", "an old clock", "a winter garden", "a night train",
          "a copper key", "a quiet harbor")


@dataclass(frozen=True)
class Arm:
    """One arm's figures."""

    name: str
    wall_s: float
    tokens: int
    updates: int
    update_s: list[float]
    spanning: int  # requests whose output carries two versions or more
    preemptions: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def preemptions(text: str) -> int:
    """vLLM's preemption counter from a ``/metrics`` body (0 when absent)."""
    return counter_total(metric_totals(text)[0], "vllm:num_preemptions")


async def run_arm(name: str, root: str, model: str, prompts: list[list[int]], args: argparse.Namespace,
                  folder: str, first_version: int) -> tuple[Arm, int]:
    """Answer every prompt, ``args.concurrency`` at a time; in the ``keep`` arm, load a new version every
    ``args.every`` seconds until the last answer. Returns the arm and the next version number."""
    body = {"sampling_params": {"max_tokens": args.max_tokens, "temperature": 1.0, "ignore_eos": True,
                                "logprobs": 0}, "output_mode": "text", "return_token_ids": True, "model": model}
    slots = asyncio.Semaphore(args.concurrency)
    tokens, spanning, update_s = 0, 0, []
    version = first_version
    async with httpx.AsyncClient(base_url=generate_base_url(root), timeout=900) as http, \
            EngineClient(root, timeout_s=300) as control:
        before = preemptions((await http.get(root + "/metrics")).text)

        async def one(ids: list[int]) -> None:
            nonlocal tokens, spanning
            async with slots:
                r = await http.post("/generate", json={**body, "token_ids": ids})
                r.raise_for_status()
                choice = r.json()["choices"][0]
                tokens += len(choice["token_ids"])
                spanning += len({s["version"] for s in choice.get("weight_versions") or []}) >= 2

        done = asyncio.Event()

        async def updates() -> None:
            nonlocal version
            while not done.is_set():
                try:
                    await asyncio.wait_for(done.wait(), timeout=args.every)
                    return
                except TimeoutError:
                    pass
                version += 1
                t = time.perf_counter()
                await load_weights(control, folder, version, mode="keep", timeout_s=300, keep_kv=name == "keep-kv")
                update_s.append(time.perf_counter() - t)

        started = time.perf_counter()
        updater = asyncio.create_task(updates()) if name != "none" else None
        try:
            await asyncio.gather(*(one(p) for p in prompts))
        finally:
            done.set()
            if updater is not None:
                await updater
        wall = time.perf_counter() - started
        after = preemptions((await http.get(root + "/metrics")).text)
    return Arm(name, wall, tokens, len(update_s), update_s, spanning, after - before), version


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--every", type=float, default=8.0, help="seconds between weight updates in the keep arms")
    p.add_argument("--out", type=Path, default=Path("runs/interruption"))
    args = p.parse_args()
    console = Console(width=140)
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_model("smollm2-135m")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [list(tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Tell a long story about {TOPICS[i % len(TOPICS)]} (story {i})."}],
        tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]) for i in range(args.requests)]
    config = VLLMServerConfig(model=str(model_dir), dtype="float32", max_model_len=2048, kv_cache_gib=2,
                              token_route=True, log_path=args.out / "vllm.log")
    with sigterm_as_interrupt(), VLLMServer(config) as server:  # a SIGTERM unwinds through the server's exit
        async def both() -> list[Arm]:
            async with EngineClient(server.root_url) as control:
                folder = await control.served_model_dir() or str(model_dir)
            warm, _ = await run_arm("none", server.root_url, server.model_name, prompts[:args.concurrency], args,
                                    folder, 0)  # warm-up: compile and caches, not reported
            console.print(f"warm-up: {warm.tokens} tokens in {warm.wall_s:.1f} s")
            none, version = await run_arm("none", server.root_url, server.model_name, prompts, args, folder, 0)
            keep, version = await run_arm("keep", server.root_url, server.model_name, prompts, args, folder, version)
            kept, _ = await run_arm("keep-kv", server.root_url, server.model_name, prompts, args, folder, version)
            return [none, keep, kept]

        none, keep, kept = asyncio.run(both())
    table = Table(title=f"Weight updates on in-flight requests: {args.requests} requests x {args.max_tokens} "
                        f"tokens, {args.concurrency} in flight, an update every {args.every:g} s in 'keep'")
    for col in ("arm", "wall s", "tok/s", "x none", "updates", "s per update (mean, max)", "requests spanning 2+ versions",
                "preemptions"):
        table.add_column(col, justify="right")
    for arm in (none, keep, kept):
        mean = sum(arm.update_s) / len(arm.update_s) if arm.update_s else 0.0
        table.add_row(arm.name, f"{arm.wall_s:.1f}", f"{arm.tokens_per_s:.1f}",
                      f"{arm.tokens_per_s / none.tokens_per_s:.2f}x", str(arm.updates),
                      f"{mean:.2f}, {max(arm.update_s, default=0):.2f}", f"{arm.spanning}/{args.requests}",
                      str(arm.preemptions))
    console.print(table)
    costs = {}
    for arm in (keep, kept):
        costs[arm.name] = (arm.wall_s - none.wall_s) / arm.updates if arm.updates else float("nan")
        console.print(f"{arm.name}: one update cost the run {costs[arm.name]:.2f} s of wall time ({arm.name} - none, "
                      f"over {arm.updates} updates); its own pause-to-resume took "
                      f"{sum(arm.update_s) / max(arm.updates, 1):.2f} s")
    (args.out / "interruption.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "arms": [asdict(a) for a in (none, keep, kept)],
         "cost_s_per_update": costs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
