"""FSDP2 (``learner.sharding=fsdp2``, sao.rl.learner.sharding) on CUDA: the update on the shards equals the
single-process update, and the peak GPU memory of a training step, replicated vs sharded. Nothing
imports this script; it is the GPU twin of tests/test_sharding.py (which runs the same check on two
gloo CPU ranks).

    .venv/bin/python benchmarks/gpu/fsdp2_check.py              # ~1-2 min on one H200
    .venv/bin/python benchmarks/gpu/fsdp2_check.py --layers 4   # smaller, faster
    .venv/bin/python benchmarks/gpu/fsdp2_check.py --device cpu --layers 2 --hidden 64 --vocab 256 --seq 32
                                          # a dry run of this script's logic on 2 gloo CPU ranks, no memory figures

NOT RUN ON A GPU YET. It was written on a machine without one; only its ``--device cpu`` dry run
(gloo, tiny sizes) has run. The first run on a GPU is its test.

Ranks: with 2+ GPUs, 2 NCCL ranks, one GPU each (``--world`` to change). With one GPU, ONE rank
(world_size=1): NCCL refuses two ranks on the same GPU ("Duplicate GPU detected"), and gloo has no
CUDA reduce-scatter. One rank still runs the whole CUDA path (fully_shard, NCCL all-gather and
reduce-scatter, clipping and optimizer steps on DTensors), but every shard is then the whole
parameter, so its sharded peak memory can only match the replicated one; the saving (about
(params + grads + AdamW state) x (1 - 1/N)) needs N >= 2 GPUs. The script says which case ran.

What it does, on every rank:
1. Equality: a random untied Llama (``--layers`` x ``--hidden``, fp32, eager attention, TF32 off),
   2 SGD steps (lr 0.5, gradient norm clipped to 1) on -sum log p(token) / (the whole batch's token
   count): rank 0 on the whole batch with the plain model (the reference), each rank on its rows
   (r, r + N, ...) with the FSDP2-wrapped copy. PASS when every parameter is within --tol (1e-5:
   fp32 sums over a larger model than the CPU test's, in another order; the CPU test holds 1e-6).
2. Memory: one AdamW step on each rank's rows, replicated (whole model, gradients all-reduced by
   sao.rl.learner.parallel.data_parallel.DataParallel.sum_grads) then sharded (FSDP2, its reduce-scatter summing),
   each from an empty cache with torch.cuda.reset_peak_memory_stats; prints
   torch.cuda.max_memory_allocated per rank.
Exit status 0 when every check passed. When $OUT is set, the summary is also written to
$OUT/fsdp2_check.json. Every collective has a 3-minute timeout, so a hang fails instead of waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GIB = 1024**3


def build_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                         num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=8,
                         max_position_embeddings=args.seq, tie_word_embeddings=False, attn_implementation="eager")
    return LlamaForCausalLM(config).float().eval().to(device)


def batch(args: argparse.Namespace, device: torch.device) -> torch.Tensor:
    return torch.randint(0, args.vocab, (args.rows, args.seq), generator=torch.Generator().manual_seed(1)).to(device)


def loss_of(model: torch.nn.Module, ids: torch.Tensor, normalizer: float) -> torch.Tensor:
    logits = model(input_ids=ids).logits.float()
    logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return -logp.sum() / normalizer


def sgd_steps(model: torch.nn.Module, ids: torch.Tensor, normalizer: float, steps: int = 2) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_of(model, ids, normalizer).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def peak_step(model: torch.nn.Module, ids: torch.Tensor, normalizer: float, sum_grads) -> float:  # noqa: ANN001
    """Peak GiB allocated over one AdamW step (the model already on the GPU counts); NaN on the CPU."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    loss_of(model, ids, normalizer).backward()
    sum_grads(model.parameters())
    opt.step()
    opt.zero_grad(set_to_none=True)
    if ids.device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / GIB


def fresh_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def rank_main(rank: int, args: argparse.Namespace, world: int, init_file: str, out_dir: str) -> None:
    from sao.rl.learner.parallel.data_parallel import DataParallel
    from sao.rl.learner.sharding import FullyShardedFSDP2

    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(minutes=3), device_id=device)
    else:  # the dry run
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(minutes=3))
    result: dict = {"rank": rank}
    try:
        ids = batch(args, device)
        normalizer = float(ids[:, 1:].numel())
        mine = ids[rank::world]
        sharding = FullyShardedFSDP2()

        # 1. equality
        if rank == 0:
            reference = build_model(args, device)
            sgd_steps(reference, ids, normalizer)
            ref_state = {k: v.detach().cpu() for k, v in reference.state_dict().items()}
            initial = {k: v.cpu() for k, v in build_model(args, torch.device("cpu")).state_dict().items()}
            del reference
        sharded = build_model(args, device)
        record = sharding.wrap(sharded)
        sgd_steps(sharded, mine, normalizer)
        full = {k: v.detach().cpu() for k, v in sharding.full_state_dict(sharded).items()}  # a collective
        del sharded
        if rank == 0:
            worst = max(float((full[k] - ref_state[k]).abs().max()) for k in ref_state)
            moved = max(float((ref_state[k] - initial[k]).abs().max()) for k in ref_state)
            result |= {"max_abs_diff": worst, "max_abs_update": moved, "units": len(record.units),
                       "params": record.params}
        result["local_params"] = record.local_params

        # 2. memory: replicated, then sharded, each from an empty cache
        fresh_peak(device)
        replicated = build_model(args, device)
        result["peak_gib_replicated"] = peak_step(replicated, mine, normalizer, DataParallel().sum_grads)
        del replicated
        fresh_peak(device)
        sharded = build_model(args, device)
        sharding.wrap(sharded)
        # FSDP2 has summed the gradients: the learner's all-reduce is skipped (a no-op here)
        no_reduce = DataParallel(reduce_grads=not sharding.reduces_grads)
        result["peak_gib_sharded"] = peak_step(sharded, mine, normalizer, no_reduce.sum_grads)
        del sharded
        dist.barrier()
    except Exception as exc:  # noqa: BLE001 - reported as FAIL by the parent
        result["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        if dist.is_initialized():
            dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=None, help="ranks (default: 2 with 2+ GPUs, else 1)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a dry run of the script on 2 gloo CPU ranks (use tiny sizes), no memory figures")
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "cpu":
        world = args.world or 2
        print(f"torch {torch.__version__}: DRY RUN on {world} gloo CPU rank(s); no GPU memory figures")
    else:
        if not gpus:
            print("FAIL: no CUDA device (this script checks FSDP2 on GPUs; tests/test_sharding.py is the CPU check)")
            return 1
        world = args.world or (2 if gpus >= 2 else 1)
        if world > gpus:
            print(f"FAIL: --world {world} needs a GPU a rank (NCCL refuses two ranks on one GPU); {gpus} GPU(s)")
            return 1
        print(f"torch {torch.__version__}, {gpus} GPU(s) ({torch.cuda.get_device_name(0)}): {world} NCCL rank(s), "
              f"one GPU each" + ("; ONE rank, so every shard is the whole model: no memory saving to expect"
                                 if world == 1 else ""))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        failed_to_run = None
        try:
            mp.start_processes(rank_main, args=(args, world, os.path.join(tmp, "init"), tmp), nprocs=world,
                               start_method="spawn")
        except Exception as exc:  # noqa: BLE001
            failed_to_run = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        results = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
    elapsed = time.monotonic() - started
    ok = failed_to_run is None and len(results) == world and not any("error" in r for r in results)
    lines = []
    if not ok:
        errors = [r.get("error") for r in results if "error" in r] or [failed_to_run or "a rank wrote no result"]
        lines.append(f"FAIL run: {errors[0]}")
    else:
        r0 = results[0]
        equal = r0["max_abs_diff"] <= args.tol
        trained = r0["max_abs_update"] > 100 * args.tol
        lines.append(f"{'PASS' if equal else 'FAIL'} equality: FSDP2 on {world} rank(s) vs one process, max |diff| "
                     f"{r0['max_abs_diff']:.3g} (tolerance {args.tol:g}; the update itself moved parameters by up "
                     f"to {r0['max_abs_update']:.3g})")
        lines.append(f"{'PASS' if trained else 'FAIL'} the reference trained (max |update| > 100 x tolerance)")
        rep = [r["peak_gib_replicated"] for r in results]
        sha = [r["peak_gib_sharded"] for r in results]
        local = [r["local_params"] for r in results]
        lines.append(f"INFO model: {r0['params'] / 1e6:.1f}M params, {r0['units']} FSDP units; per rank stored "
                     f"{', '.join(f'{x / 1e6:.1f}M' for x in local)}")
        lines.append(f"INFO peak GPU memory of one AdamW step per rank: replicated "
                     f"{', '.join(f'{x:.2f}' for x in rep)} GiB; sharded {', '.join(f'{x:.2f}' for x in sha)} GiB")
        if args.device == "cpu":
            lines.append("INFO dry run on the CPU: the memory figures are GPU-only (nan)")
        elif world >= 2:
            smaller = max(sha) < max(rep)
            lines.append(f"{'PASS' if smaller else 'FAIL'} sharded peak below replicated "
                         f"({max(sha):.2f} vs {max(rep):.2f} GiB)")
        else:
            lines.append("INFO one rank: no sharding saving expected (run on 2+ GPUs to see it)")
        ok = equal and trained and all(not line.startswith("FAIL") for line in lines)
    lines.append(f"{'PASS' if ok else 'FAIL'} fsdp2_check ({elapsed:.0f} s)")
    print("\n".join(lines))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "fsdp2_check.json").write_text(
            json.dumps({"world": world, "gpus": gpus, "device": args.device, "ok": ok, "lines": lines, "ranks": results}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
