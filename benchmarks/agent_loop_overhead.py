"""Overhead of the agent loop and of the capture proxy: the same requests straight to vLLM vs through
the loop and the env, and through the proxy.

    python benchmarks/agent_loop_overhead.py [--base-url URL --model NAME] [--requests 64] [--concurrency 32]

The arms send the same 64 arithmetic prompts (the same token ids, sampling seeds and limits) at
the same concurrency. "direct" posts to ``/v1/completions`` with the OpenAI SDK and nothing else;
"loop" runs full episodes: env reset, chat rendering, the client with its checks, env.step with
answer extraction and grading, and the trajectory record; "proxy" sends the env's chat messages as an
unchanged agent would (the SDK's typed ``chat.completions.create``, one capture-proxy session per
request), and the proxy renders them, samples on vLLM's token route and records the call
(sao.agents.capture). The arms alternate (direct, loop, proxy, proxy, loop, direct, ...) after one
warm-up round, and the figure is completion tokens per second of wall time. Targets: loop / direct and
proxy / direct >= 0.95. A server given by ``--base-url`` must serve the token route (vLLM's scale-out
flag); the managed one is started with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Iterator

import httpx
import openai
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

import sao.envs as E
from sao.agents import ChatRenderer, LoopConfig, OpenAICompletionClient, run_episode
from sao.agents.capture import AgentSampling, CaptureProxy, TokenUpstream, default_tool_parser
from sao.agents.clients.endpoint import Endpoint, open_endpoint
from sao.agents.clients.generate import GenerateClient, generate_base_url
from sao.agents.loop.episodes import Renderers
from sao.envs.arithmetic import ArithmeticTasks

ARMS = ("direct", "loop", "proxy")


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


async def proxy(endpoint: Endpoint, tokenizer, messages: list[list[dict]], seeds: list[int], args) -> int:
    root = endpoint.base_url.removesuffix("/v1")
    client = GenerateClient(generate_base_url(root), endpoint.model, max_connections=args.concurrency)
    upstream = TokenUpstream(client, Renderers(tokenizer), default_tool_parser(tokenizer), endpoint.model)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(sdk: openai.AsyncOpenAI, chat: list[dict], seed: int) -> int:
        async with gate:
            with proxy_server.session(upstream, AgentSampling()) as session:
                answer = await sdk.with_options(base_url=session.base_url).chat.completions.create(
                    model=session.model, messages=chat, max_tokens=args.max_tokens, temperature=1.0, seed=seed)
                assert session.calls[0].completion is not None
                return answer.usage.completion_tokens

    async with CaptureProxy() as proxy_server:
        sdk = openai.AsyncOpenAI(base_url=proxy_server.url, api_key="EMPTY", max_retries=0, timeout=600)
        try:
            return sum(await asyncio.gather(*(one(sdk, m, s) for m, s in zip(messages, seeds))))
        finally:
            await sdk.close()
            await client.aclose()


@contextlib.contextmanager
def engine(args) -> Iterator[Endpoint]:
    """The given server, or a managed one that also serves the token route (the proxy arm samples there)."""
    if args.base_url:
        with open_endpoint(args.model, base_url=args.base_url, max_model_len=4096) as endpoint:
            yield endpoint
        return
    from sao.agents.engine.server import VLLMServer, VLLMServerConfig
    from sao.agents.models.prepare import ensure_model

    path = ensure_model(args.model)
    # 4096: the context it was measured with (a managed engine would otherwise take the model's own)
    config = VLLMServerConfig(model=path, served_model_name=args.model, max_model_len=4096, token_route=True)
    with VLLMServer(config) as server:
        yield Endpoint(server.base_url, args.model, path, 4096, managed=True, server=server)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per arm")
    args = p.parse_args()

    with engine(args) as endpoint:
        tokenizer = AutoTokenizer.from_pretrained(endpoint.tokenizer)
        renderer = ChatRenderer(tokenizer)
        task_ids = ArithmeticTasks(seed=0, difficulty=0.5).ids(args.requests)
        prompts, messages = [], []
        for task_id in task_ids:
            env = E.make("arithmetic")
            obs, _ = env.reset(options={"task_id": task_id})
            prompts.append(renderer.prompt(obs))
            messages.append(list(obs))
        seeds = list(range(args.requests))
        # The loop seeds request k of an episode with seed * 1000 + k; give "direct" the same seeds.
        direct_seeds = [s * 1000 for s in seeds]

        def run(arm: str) -> tuple[int, float]:
            t0 = time.perf_counter()
            if arm == "direct":
                n = asyncio.run(direct(endpoint.base_url, endpoint.model, prompts, direct_seeds, args))
            elif arm == "proxy":
                n = asyncio.run(proxy(endpoint, tokenizer, messages, direct_seeds, args))
            else:
                n = asyncio.run(loop(endpoint.base_url, endpoint.model, renderer, task_ids, seeds, args))
            return n, time.perf_counter() - t0

        run("direct")  # warm-up: compile paths, fill caches
        rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
        tokens: dict[str, list[int]] = {arm: [] for arm in ARMS}
        order = ["direct", "loop", "proxy", "proxy", "loop", "direct"] * ((args.rounds + 1) // 2)
        for arm in order[: len(ARMS) * args.rounds]:
            n, dt = run(arm)
            rates[arm].append(n / dt)
            tokens[arm].append(n)

    table = Table(title=f"agent loop overhead: {args.requests} requests, concurrency {args.concurrency}, "
                        f"max_tokens {args.max_tokens}")
    for col in ("arm", "tokens/s (median)", "tokens/s (each round)", "tokens per round"):
        table.add_column(col)
    for arm in ARMS:
        table.add_row(arm, f"{statistics.median(rates[arm]):.1f}", ", ".join(f"{r:.1f}" for r in rates[arm]),
                      ", ".join(map(str, tokens[arm])))
    Console().print(table)
    for arm in ("loop", "proxy"):
        ratio = statistics.median(rates[arm]) / statistics.median(rates["direct"])
        print(f"ratio {arm}/direct (median tokens/s): {ratio:.3f}  (target >= 0.95)")


if __name__ == "__main__":
    main()
