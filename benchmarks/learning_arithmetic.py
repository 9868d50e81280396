"""SAO vs GRPO with DIS vs GRPO on generated arithmetic, at an equal sample budget. Not in CI.

    .venv/bin/python benchmarks/learning_arithmetic.py [--budget 192] [--seeds 1,2] [--out runs/learning_arithmetic]

One local vLLM (SmolLM2-135M, CPU) serves every run in turn; each run first syncs its own initial
weights into it (version 0), so runs do not leak into each other. Every algorithm sees the same
number of trajectories (``--budget``): SAO spends ``--pretrain`` of its batches on critic-only
pretraining and the rest on policy steps; GRPO variants sample ``--group`` rollouts of
``batch / group`` prompts per step. Prompts are fresh draws from the endless generator, so the
training accuracy of a batch is the current policy's accuracy on unseen problems.

Prints, per algorithm (mean over seeds), the accuracy in consecutive windows of trajectories, and
writes ``OUT/curves.png`` (reward and the other panels against trajectories) with sao-report.
A run folder that already finished is reused, so an interrupted benchmark can be rerun.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table


def build_config(algo: str, seed: int, args: argparse.Namespace, base_url: str):  # type: ignore[no-untyped-def]
    from hydra import compose, initialize_config_module

    import sao.rl.train_cli  # noqa: F401  (schema + resolver)
    from sao.rl.train_cli import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        cfg = to_config(compose("config", overrides=[f"algo={algo}", f"seed={seed}"]))
    batches = args.budget // args.batch
    pretrain = args.pretrain if cfg.algo.name in ("sao", "ppo") else 0
    algo_cfg = replace(cfg.algo, group_size=args.group) if cfg.algo.group_size > 1 else cfg.algo
    return replace(
        cfg, max_steps=batches - pretrain, value_pretrain_steps=pretrain, batch_size=args.batch, seed=seed,
        checkpoint_every=10_000, keep_checkpoints=1, algo=algo_cfg,
        optim=replace(cfg.optim, lr=args.lr),
        env=replace(cfg.env, kwargs={**cfg.env.kwargs, "seed": seed, "ops": args.ops, "difficulty": args.difficulty,
                                     "max_digits": args.max_digits}, max_tokens=args.max_tokens),
        engine=replace(cfg.engine, base_url=base_url, served_name="smollm2-135m"),
        logger=replace(cfg.logger, console=True, tensorboard=False))


def finished(run_dir: Path, steps: int) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.is_file() and len(path.read_text().splitlines()) >= steps


def accuracy_windows(run_dir: Path, window: int) -> list[float]:
    """Mean accuracy of each consecutive ``window`` of trajectories (pretraining batches included)."""
    per_batch: list[tuple[float, float]] = []  # (trajectories, accuracy)
    pretrain = run_dir / "value_pretrain.jsonl"
    for path in (pretrain, run_dir / "metrics.jsonl"):
        if path.is_file():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row.get("reward/accuracy") is not None:
                    per_batch.append((row["rollout/trajectories"], row["reward/accuracy"]))
    out, seen, acc = [], 0.0, 0.0
    for n, a in per_batch:
        seen, acc = seen + n, acc + a * n
        if seen >= window:
            out.append(acc / seen)
            seen, acc = 0.0, 0.0
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="sao,grpo_dis,grpo")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--budget", type=int, default=192, help="trajectories per run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="GRPO samples per prompt")
    parser.add_argument("--pretrain", type=int, default=2, help="SAO critic-only batches (inside the budget)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--ops", default="+-")
    parser.add_argument("--difficulty", type=float, default=0.0)
    parser.add_argument("--max-digits", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--window", type=int, default=32, help="trajectories per accuracy window")
    parser.add_argument("--out", type=Path, default=Path("runs/learning_arithmetic"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    from sao.agents.engine import VLLMServer, VLLMServerConfig
    from sao.agents.model import ensure_model
    from sao.rl.build import run_training
    from sao.rl.report import draw

    algos, seeds = args.algos.split(","), [int(s) for s in args.seeds.split(",")]
    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    runs: dict[str, list[Path]] = {a: [] for a in algos}
    model = ensure_model("smollm2-135m")
    with VLLMServer(VLLMServerConfig(model=model, served_model_name="smollm2-135m", max_model_len=2048,
                                     kv_cache_gib=2, log_path=args.out / "vllm.log")) as server:
        for seed in seeds:
            for algo in algos:
                cfg = build_config(algo, seed, args, server.root_url)
                run_dir = args.out / f"{algo}-seed{seed}"
                runs[algo].append(run_dir)
                if finished(run_dir, cfg.max_steps):
                    console.print(f"[dim]{run_dir}: already finished, reused[/dim]")
                    continue
                started = time.monotonic()
                run_training(replace(cfg, output_dir=str(run_dir), resume=True), run_dir)
                console.print(f"[bold]{run_dir}[/bold] done in {time.monotonic() - started:.0f} s")
    wall = time.monotonic() - t0

    table = Table(title=f"accuracy on fresh arithmetic problems, mean over seeds {seeds} "
                        f"(windows of {args.window} trajectories)")
    table.add_column("algo")
    n_windows = args.budget // args.window
    for w in range(n_windows):
        table.add_column(f"{w * args.window}-{(w + 1) * args.window}", justify="right")
    summary = {}
    for algo, dirs in runs.items():
        per_seed = [accuracy_windows(d, args.window) for d in dirs]
        cols = []
        for w in range(n_windows):
            vals = [s[w] for s in per_seed if len(s) > w]
            cols.append(sum(vals) / len(vals) if vals else float("nan"))
        summary[algo] = {"windows": cols, "per_seed": per_seed}
        table.add_row(algo, *[f"{c:.3f}" for c in cols])
    console.print(table)
    (args.out / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "wall_s": wall, "algos": summary}, indent=2) + "\n")
    all_dirs = [d for dirs in runs.values() for d in dirs]
    draw(all_dirs, args.out / "curves.png", x="samples", label="algo", smooth_window=3)
    console.print(f"wall {wall / 60:.1f} min; curves: {args.out / 'curves.png'}; summary: {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
