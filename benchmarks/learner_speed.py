"""The learner's update speed per algorithm, next to a bare forward + backward + AdamW step of the same
model on the same tokens, measured side by side in one run. Not in CI.

    .venv/bin/python benchmarks/learner_speed.py [--algos sao,grpo_dis,grpo] [--steps 4] [--batch 8]
        [--prompt 40] [--response 60] [--set KEY=VALUE ...]

Each algorithm's learner is built as ``sao-train`` builds it (its defaults: precision, micro-batch
budget, critic steps), on synthetic batches shaped like the default arithmetic run. The bare step
is ``model(ids).logits`` -> cross-entropy on every token -> backward -> AdamW, on the policy alone, in
fp32 and under bf16 autocast. One warm-up update each, then ``--steps`` timed ones; the reference
bare step runs between the algorithms, so a machine that slows down shows in its figures too.

Prints seconds per update, tokens/s (real tokens of the batch, prompt included) and the ratio to
the bare fp32 step. Goal (issue 13, 2 idle cores): SAO <= 12 s, GRPO <= 5 s for 8 x ~100 tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def bare_step_s(policy, batch, steps: int, bf16: bool) -> float:  # type: ignore[no-untyped-def]
    import contextlib

    import torch

    opt = torch.optim.AdamW(policy.parameters(), lr=0.0)  # lr 0: the weights stay as they were
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        with ctx():
            logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), batch.input_ids[:, 1:].flatten(),
                                                 reduction="none")
        (loss * batch.attention_mask[:, 1:].flatten()).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits, loss
        if i:
            times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", default="sao,grpo_dis,grpo")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=40)
    p.add_argument("--response", type=int, default=60)
    p.add_argument("--set", action="append", default=[], help="a sao-train override, e.g. optim.bf16=false")
    args = p.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table

    from learner_bench import build, compose, synthetic_batch
    from sao.rl.learner.memory import configure_allocator

    configure_allocator()
    torch.manual_seed(0)
    rows = []
    for algo_name in args.algos.split(","):
        cfg = compose([f"algo={algo_name}", f"batch_size={args.batch}", *args.set])
        algo, learner = build(cfg)
        batches = [synthetic_batch(s, args.batch, cfg.algo.group_size, args.prompt, args.response)
                   for s in range(args.steps + 1)]
        tokens = sum(int(b.attention_mask.sum()) for b in batches[1:]) / args.steps
        if algo.uses_critic:
            algo.pretrain_critic(learner, batches[0])
        times = []
        for i, b in enumerate(batches):
            t0 = time.perf_counter()
            algo.update(learner, b)
            if i:
                times.append(time.perf_counter() - t0)
        algo_s = sum(times) / len(times)
        ref = batches[1]
        bare32 = bare_step_s(learner.policy, ref, args.steps, bf16=False)
        bare16 = bare_step_s(learner.policy, ref, args.steps, bf16=True)
        ref_tokens = int(ref.attention_mask.sum())
        rows.append((algo_name, algo_s, tokens / algo_s, bare32, ref_tokens / bare32, bare16, ref_tokens / bare16))
        print(f"{algo_name}: {algo_s:.2f} s/update ({tokens / algo_s:.0f} tok/s); bare fp32 {bare32:.2f} s "
              f"({ref_tokens / bare32:.0f} tok/s), bare bf16 {bare16:.2f} s ({ref_tokens / bare16:.0f} tok/s)", flush=True)
        del algo, learner
    table = Table(title=f"learner speed: batch {args.batch} x ~{args.prompt}+{args.response} tokens, "
                        f"{torch.get_num_threads()} threads; {' '.join(args.set) or 'defaults'}")
    for col in ("algo", "s/update", "tok/s", "bare fp32 s", "bare fp32 tok/s", "bare bf16 s", "bare bf16 tok/s",
                "algo / bare fp32", "algo / bare bf16"):
        table.add_column(col, justify="right")
    for name, s, tps, b32, t32, b16, t16 in rows:
        table.add_row(name, f"{s:.2f}", f"{tps:.0f}", f"{b32:.2f}", f"{t32:.0f}", f"{b16:.2f}", f"{t16:.0f}",
                      f"{tps / t32:.2f}", f"{tps / t16:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
