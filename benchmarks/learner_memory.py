"""Peak RSS of the learner process over many updates, for SAO and GRPO. Not in CI.

    .venv/bin/python benchmarks/learner_memory.py [--steps 50] [--algos sao,grpo] [--batch 8]
        [--prompt 40] [--response 60] [--variants tuned,glibc-default] [--set KEY=VALUE ...]

Builds the default run's learner exactly as ``sao-train`` does (SmolLM2-135M, fp32 masters, the
algorithm's optimizers, the value model for SAO), then runs ``--steps`` updates on synthetic
batches shaped like the default arithmetic run (``--batch`` trajectories of ``--prompt`` prompt
tokens and 0.5-1.5 x ``--response`` sampled tokens), each followed by the weight sync's checkpoint
write in the engine's dtype, as the trainer does: on the learner's one thread, with
:func:`sao.rl.learner.memory.release` after each step. Each (variant, algorithm) runs in a fresh child
process. Variants: ``tuned`` is what the entry points do (:func:`sao.rl.learner.memory.configure_allocator`);
``glibc-default`` skips it (what the run did before issue 13, minus the thread fix).

Prints per run: RSS after steps 1, 5 and the last, the peak (VmHWM), the growth from step 5 to the
last step, and seconds per update. Budget (issue 13): peak <= 6 GB, growth <= 10%.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def child(args: argparse.Namespace) -> None:
    import asyncio

    import torch

    from learner_bench import build, compose, synthetic_batch
    from sao.rl.learner.memory import configure_allocator, release, rss_gb
    from sao.rl.learner.torch_thread import TorchThread, pin_caller
    from sao.rl.weights.sync import save_checkpoint

    if args.variant == "tuned":
        configure_allocator()
    cfg = compose([f"algo={args.algo}", f"batch_size={args.batch}", *args.set])
    thread, rows = TorchThread(pin_caller()), []  # as sao-train: every torch call on one thread
    algo, learner = thread.call(build, cfg)
    scratch = tempfile.TemporaryDirectory(prefix="sao-mem-")  # removed at exit: 0.5-1.3 GB of weights
    weights = Path(scratch.name)
    dtype = getattr(torch, cfg.model.engine_dtype)

    async def run() -> None:
        for step in range(1, args.steps + 1):
            b = synthetic_batch(step, args.batch, cfg.algo.group_size, args.prompt, args.response)
            t0 = time.perf_counter()
            if algo.uses_critic and step == 1:
                await thread.run(algo.pretrain_critic, learner, b)
            await thread.run(algo.update, learner, b)
            update_s = time.perf_counter() - t0
            await thread.run(save_checkpoint, learner.policy, weights, step, keep=2, dtype=dtype)
            release()
            rss, peak = rss_gb()
            rows.append({"step": step, "rss_gb": rss, "peak_gb": peak, "update_s": update_s})

    try:
        asyncio.run(run())
    finally:
        thread.close()
        scratch.cleanup()
    print(json.dumps(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--algos", default="sao,grpo")
    p.add_argument("--variants", default="tuned")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=40)
    p.add_argument("--response", type=int, default=60)
    p.add_argument("--set", action="append", default=[], help="a sao-train override, e.g. optim.bf16=true")
    p.add_argument("--algo", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.algo:
        child(args)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"learner RSS over {args.steps} updates (batch {args.batch}, "
                        f"~{args.prompt}+{args.response} tokens; {' '.join(args.set) or 'defaults'})")
    for col in ("variant", "algo", "step 1 GB", "step 5 GB", f"step {args.steps} GB", "peak GB", "growth 5->end",
                "s/update"):
        table.add_column(col, justify="right")
    for variant in args.variants.split(","):
        for algo in args.algos.split(","):
            extra = [x for a in args.set for x in ("--set", a)]
            cmd = [sys.executable, __file__, "--algo", algo, "--variant", variant, "--steps", str(args.steps),
                   "--batch", str(args.batch), "--prompt", str(args.prompt), "--response", str(args.response), *extra]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            rows = json.loads(out)
            by = {r["step"]: r for r in rows}
            s5, end = by[min(5, len(rows))]["rss_gb"], rows[-1]
            speed = sum(r["update_s"] for r in rows[1:]) / max(len(rows) - 1, 1)
            table.add_row(variant, algo, f"{by[1]['rss_gb']:.2f}", f"{s5:.2f}", f"{end['rss_gb']:.2f}",
                          f"{end['peak_gb']:.2f}", f"{(end['rss_gb'] - s5) / s5:+.1%}", f"{speed:.1f}")
            print(json.dumps({"variant": variant, "algo": algo, "rows": rows}), flush=True)
    Console().print(table)


if __name__ == "__main__":
    main()
