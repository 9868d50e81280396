"""Decode throughput of one managed vLLM (the bundled model) under different core bindings, started
one after the other in one run. Not in CI.

    .venv/bin/python benchmarks/engine_cores.py [--binds auto,0-1,auto] [--dtype float32]

``auto`` is vLLM's own choice (on a CPU-only machine: every core but one, which it reserves for its
front-end; on 2 cores that is core 0 alone); any other value is passed as
``VLLM_CPU_OMP_THREADS_BIND``. Each engine gets a warm-up, then 8 concurrent requests of 64 tokens
twice and 64 concurrent requests once (``ignore_eos``, so every request decodes its 64 tokens).
Repeat a binding (``auto,0-1,auto``) to see how much the machine drifted during the run. Prints the
start time and the tokens/s; behind :func:`sao.agents.engine.fleet.cpu_share`'s choice for one replica.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from tempfile import TemporaryDirectory

PROMPTS = [f"Question {i}: what is {17 * i + 3} + {29 * i + 11}? Think step by step, then answer." for i in range(64)]


async def tokens_per_s(base_url: str, n: int, max_tokens: int) -> float:
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        async def one(prompt: str) -> int:
            r = await client.post(base_url + "/completions", json={
                "model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "seed": 1,
                "ignore_eos": True})
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*[one(p) for p in PROMPTS[:n]]))
        return tokens / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binds", default="auto,0-1,auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--model", default="smollm2-135m")
    args = p.parse_args()

    from rich.console import Console
    from rich.table import Table

    from sao.agents.engine.server import VLLMServer, VLLMServerConfig
    from sao.agents.models.prepare import ensure_model

    path = ensure_model(args.model)
    table = Table(title=f"one vLLM, {args.model} ({args.dtype}): decode tokens/s by core binding")
    for col in ("binding", "start s", "8 concurrent", "8 concurrent (again)", "64 concurrent"):
        table.add_column(col, justify="right")
    with TemporaryDirectory() as logs:
        for bind in args.binds.split(","):
            env = {} if bind == "auto" else {"VLLM_CPU_OMP_THREADS_BIND": bind}
            config = VLLMServerConfig(model=str(path), served_model_name="m", max_model_len=2048, kv_cache_gib=2,
                                      dtype=args.dtype, log_path=Path(logs) / f"vllm-{bind}.log", env=env)
            t0 = time.perf_counter()
            with VLLMServer(config) as server:
                start = time.perf_counter() - t0
                asyncio.run(tokens_per_s(server.base_url, 8, 16))  # warm-up
                r8 = [asyncio.run(tokens_per_s(server.base_url, 8, 64)) for _ in range(2)]
                r64 = asyncio.run(tokens_per_s(server.base_url, 64, 64))
            print(f"{bind}: start {start:.0f} s, 8 concurrent {r8[0]:.0f} / {r8[1]:.0f} tok/s, "
                  f"64 concurrent {r64:.0f} tok/s", flush=True)
            table.add_row(bind, f"{start:.0f}", f"{r8[0]:.0f}", f"{r8[1]:.0f}", f"{r64:.0f}")
    Console().print(table)


if __name__ == "__main__":
    main()
