"""What a weight update costs the requests it lands on (issue 11: partial rollouts on the token route).

    .venv/bin/python benchmarks/interruption.py [--requests 48] [--concurrency 16] [--max-tokens 192]
                                                [--every 4] [--out runs/interruption]

The rollout driver loads each version into a replica with ``sao.rl.weight_load.load_weights``: pause in
vLLM's ``keep`` mode (the running requests are preempted and wait), reload, relabel the version, reset
the prefix cache, resume; the requests then continue on the new weights, and the token route
(``POST /inference/v1/generate``) reports each output token's version. That is the partial rollout of
METHOD.md: no request is aborted or restarted, but every request in flight waits out the reload and,
being preempted, has its prompt and the tokens it had generated prefilled again on the new weights.

One managed vLLM (the bundled model, fp32, ``--enable-scale-out``) answers the same requests twice, side
by side: ``--requests`` token-route requests, ``--concurrency`` in flight, each generating exactly
``--max-tokens`` tokens (``ignore_eos``) at temperature 1:
- ``none``: no update;
- ``keep``: the same folder reloaded as a new version every ``--every`` seconds while requests run.
Printed: completion tokens/s of each arm and their ratio, the updates and their seconds (pause to
resume), the requests whose tokens span two versions or more, vLLM's preemptions, and the cost of one
update in seconds of the ``keep`` arm's wall time over ``none``'s. The machine is shared and has 2 cores:
the ratio from one run is the figure to read, not the absolute speeds.

First run (2026-12-03, defaults; stopped by hand after 4 minutes of the keep arm): each update took
under a second from pause to resume, but the engine's own log showed generation falling with every
update while the same 16 requests stayed in flight: 123 -> 80 -> 54 -> 44 -> 9 -> 5 tokens/s within a
minute, against 128-150 tokens/s in the ``none`` arm just before. It stayed at 3-6 tokens/s until stopped.
With ``SAO_VLLM_ARGS=-O0`` (no torch.compile) the same decay (139 -> 10 tokens/s), so it is not a recompile;
it is per request: when the slowed requests finished, new ones ran at 67 tokens/s and then slowed as updates
landed on them. Not yet explained; the training driver loads every version this way.
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

from sao.agents.engine import EngineClient, VLLMServer, VLLMServerConfig
from sao.agents.engine_metrics import counter_total, metric_totals
from sao.agents.generate import generate_base_url
from sao.agents.model import ensure_model
from sao.rl.weight_load import load_weights

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
                await load_weights(control, folder, version, mode="keep", timeout_s=300)
                update_s.append(time.perf_counter() - t)

        started = time.perf_counter()
        updater = asyncio.create_task(updates()) if name == "keep" else None
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
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--every", type=float, default=4.0, help="seconds between weight updates in the keep arm")
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
    with VLLMServer(config) as server:
        async def both() -> list[Arm]:
            async with EngineClient(server.root_url) as control:
                folder = await control.served_model_dir() or str(model_dir)
            warm, _ = await run_arm("none", server.root_url, server.model_name, prompts[:args.concurrency], args,
                                    folder, 0)  # warm-up: compile and caches, not reported
            console.print(f"warm-up: {warm.tokens} tokens in {warm.wall_s:.1f} s")
            none, version = await run_arm("none", server.root_url, server.model_name, prompts, args, folder, 0)
            keep, _ = await run_arm("keep", server.root_url, server.model_name, prompts, args, folder, version)
            return [none, keep]

        none, keep = asyncio.run(both())
    table = Table(title=f"Weight updates on in-flight requests: {args.requests} requests x {args.max_tokens} "
                        f"tokens, {args.concurrency} in flight, an update every {args.every:g} s in 'keep'")
    for col in ("arm", "wall s", "tok/s", "x none", "updates", "s per update (mean, max)", "requests spanning 2+ versions",
                "preemptions"):
        table.add_column(col, justify="right")
    for arm in (none, keep):
        mean = sum(arm.update_s) / len(arm.update_s) if arm.update_s else 0.0
        table.add_row(arm.name, f"{arm.wall_s:.1f}", f"{arm.tokens_per_s:.1f}",
                      f"{arm.tokens_per_s / none.tokens_per_s:.2f}x", str(arm.updates),
                      f"{mean:.2f}, {max(arm.update_s, default=0):.2f}", f"{arm.spanning}/{args.requests}",
                      str(arm.preemptions))
    console.print(table)
    cost = (keep.wall_s - none.wall_s) / keep.updates if keep.updates else float("nan")
    console.print(f"one update cost the run {cost:.2f} s of wall time (keep - none, over {keep.updates} updates); "
                  f"its own pause-to-resume took {sum(keep.update_s) / max(keep.updates, 1):.2f} s")
    (args.out / "interruption.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "arms": [asdict(a) for a in (none, keep)],
         "cost_s_per_update": cost}, indent=2) + "\n")


if __name__ == "__main__":
    main()
