"""Overhead of the agent loop: the same requests straight to vLLM vs through the loop and the env.

    python benchmarks/agent_loop_overhead.py [--base-url URL --model NAME] [--requests 64] [--concurrency 32]

Both arms send the same 64 arithmetic prompts (the same token ids, sampling seeds and limits) at
the same concurrency. "direct" posts to ``/v1/completions`` with the OpenAI SDK and nothing else;
"loop" runs full episodes: env reset, chat rendering, the client with its checks, env.step with
answer extraction and grading, and the trajectory record. The arms alternate (direct, loop, loop,
direct, ...) after one warm-up round, and the figure is completion tokens per second of wall time.
Target: loop / direct >= 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
import openai
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

import sao.envs as E
from sao.agents import ChatRenderer, LoopConfig, OpenAICompletionClient, run_episode
from sao.agents.clients.endpoint import open_endpoint
from sao.envs.arithmetic import ArithmeticTasks


async def direct(base_url: str, model: str, prompts: list[list[int]], seeds: list[int], args) -> int:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(prompt: list[int], seed: int) -> int:
        async with gate:  # the leanest call the SDK offers: a raw post, no typed params or response model
            body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 1.0,
                    "seed": seed, "logprobs": 0, "return_token_ids": True}
            r = await client.post("/completions", body=body, cast_to=httpx.Response)
            return r.json()["usage"]["completion_tokens"]

    try:
        return sum(await asyncio.gather(*(one(p, s) for p, s in zip(prompts, seeds))))
    finally:
        await client.close()


async def loop(base_url: str, model: str, renderer: ChatRenderer, task_ids: list[str], seeds: list[int], args) -> int:
    client = OpenAICompletionClient(base_url, model, max_connections=args.concurrency)
    cfg = LoopConfig(max_turns=1, max_tokens=args.max_tokens, temperature=1.0)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(task_id: str, seed: int) -> int:
        async with gate:
            env = E.make("arithmetic")
            t = await run_episode(env, client, renderer, cfg, env_name="arithmetic", task_id=task_id, seed=seed)
            assert t.status == "ok", t.error
            return t.num_action_tokens

    try:
        return sum(await asyncio.gather(*(one(t, s) for t, s in zip(task_ids, seeds))))
    finally:
        await client.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per arm")
    args = p.parse_args()

    # 4096: the context it was measured with (a managed engine would otherwise take the model's own)
    with open_endpoint(args.model, base_url=args.base_url, max_model_len=4096) as endpoint:
        tokenizer = AutoTokenizer.from_pretrained(endpoint.tokenizer)
        renderer = ChatRenderer(tokenizer)
        task_ids = ArithmeticTasks(seed=0, difficulty=0.5).ids(args.requests)
        prompts = []
        for task_id in task_ids:
            env = E.make("arithmetic")
            obs, _ = env.reset(options={"task_id": task_id})
            prompts.append(renderer.prompt(obs))
        seeds = list(range(args.requests))
        # The loop seeds request k of an episode with seed * 1000 + k; give "direct" the same seeds.
        direct_seeds = [s * 1000 for s in seeds]

        def run(arm: str) -> tuple[int, float]:
            t0 = time.perf_counter()
            if arm == "direct":
                n = asyncio.run(direct(endpoint.base_url, endpoint.model, prompts, direct_seeds, args))
            else:
                n = asyncio.run(loop(endpoint.base_url, endpoint.model, renderer, task_ids, seeds, args))
            return n, time.perf_counter() - t0

        run("direct")  # warm-up: compile paths, fill caches
        rates: dict[str, list[float]] = {"direct": [], "loop": []}
        tokens: dict[str, list[int]] = {"direct": [], "loop": []}
        order = ["direct", "loop", "loop", "direct"] * ((args.rounds + 1) // 2)
        for arm in order[: 2 * args.rounds]:
            n, dt = run(arm)
            rates[arm].append(n / dt)
            tokens[arm].append(n)

    table = Table(title=f"agent loop overhead: {args.requests} requests, concurrency {args.concurrency}, "
                        f"max_tokens {args.max_tokens}")
    for col in ("arm", "tokens/s (median)", "tokens/s (each round)", "tokens per round"):
        table.add_column(col)
    for arm in ("direct", "loop"):
        table.add_row(arm, f"{statistics.median(rates[arm]):.1f}", ", ".join(f"{r:.1f}" for r in rates[arm]),
                      ", ".join(map(str, tokens[arm])))
    Console().print(table)
    ratio = statistics.median(rates["loop"]) / statistics.median(rates["direct"])
    print(f"ratio loop/direct (median tokens/s): {ratio:.3f}  (target >= 0.95)")


if __name__ == "__main__":
    main()
