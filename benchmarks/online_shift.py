"""SAO vs GRPO under a shifting task distribution (online learning), on the real model. Not in CI.

    .venv/bin/python benchmarks/online_shift.py [--steps 20,20,20] [--families add,sub,mul] [--out runs/online_shift]

One local vLLM (SmolLM2-135M, CPU) serves every run in turn; each run first syncs its own initial
weights into it (version 0). Every run trains on the same piecewise schedule of arithmetic
families (``schedule=phases``: ``--families[i]`` for ``--steps[i]`` policy steps) with the same
number of trajectories per step (``--batch``; GRPO: ``batch / group`` prompts x ``group``).
Every ``--eval-every`` steps each family seen so far is probed on fixed prompts (not trained on).

Prints, per algorithm: the per-family training reward per phase, the adaptation lag after each
shift (steps until the step reward regains 80% of its mean over the ``--pre-window`` steps before
the shift; sao.rl.prompts.curriculum.adaptation_lag) and the forgetting of earlier families (best trained
reward minus the latest probe; sao.rl.prompts.curriculum.forgetting). Draws ``OUT/curves.png`` with
sao-report (per-family reward panels, phase shifts marked). A finished run folder is reused, so an
interrupted benchmark can be rerun. Sized for about 60 minutes on 2 cores with the defaults.
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


def build_config(algo: str, args: argparse.Namespace, base_url: str):  # type: ignore[no-untyped-def]
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train  # noqa: F401  (schema + resolver)
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        cfg = to_config(compose("config", overrides=[f"algo={algo}", f"seed={args.seed}", "schedule=phases"]))
    families = args.families.split(",")
    steps = [int(s) for s in args.steps.split(",")]
    if len(steps) != len(families):
        raise SystemExit(f"--steps has {len(steps)} entries, --families {len(families)}")
    phases = [{"families": [f], "steps": n} for f, n in zip(families, steps)]
    phases[-1].pop("steps")  # the last phase never ends
    algo_cfg = replace(cfg.algo, group_size=args.group) if cfg.algo.group_size > 1 else cfg.algo
    return replace(
        cfg, max_steps=sum(steps), value_pretrain_steps=args.pretrain if cfg.algo.name in ("sao", "ppo") else 0,
        batch_size=args.batch, checkpoint_every=10, keep_checkpoints=1, algo=algo_cfg,
        optim=replace(cfg.optim, lr=args.lr),
        schedule=replace(cfg.schedule, phases=phases, difficulty=0.0, eval_every=args.eval_every,
                         eval_prompts=args.eval_prompts),
        env=replace(cfg.env, kwargs={**cfg.env.kwargs, "seed": args.seed, "max_digits": args.max_digits},
                    max_tokens=args.max_tokens),
        engine=replace(cfg.engine, base_url=base_url, served_name="smollm2-135m"),
        logger=replace(cfg.logger, console=True, tensorboard=None))


def finished(run_dir: Path, steps: int) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.is_file() and len(path.read_text().splitlines()) >= steps


def phase_rewards(rows: list[dict], families: list[str], steps: list[int]) -> list[float]:
    """Mean training reward of each phase's family over the phase's steps."""
    out, start = [], 1
    for family, n in zip(families, steps):
        vals = [r[f"reward/family/{family}"] for r in rows if start <= r["step"] < start + n
                and r.get(f"reward/family/{family}") is not None]
        out.append(sum(vals) / len(vals) if vals else float("nan"))
        start += n
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="sao,grpo")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--families", default="add,sub,mul", help="one arithmetic family per phase")
    parser.add_argument("--steps", default="20,20,20", help="policy steps per phase")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="GRPO samples per prompt")
    parser.add_argument("--pretrain", type=int, default=2, help="SAO critic-only batches before the schedule")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--max-digits", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-prompts", type=int, default=8)
    parser.add_argument("--pre-window", type=int, default=5, help="steps before a shift that set its pre-shift level")
    parser.add_argument("--out", type=Path, default=Path("runs/online_shift"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    from sao.agents.engine.server import VLLMServer, VLLMServerConfig
    from sao.agents.models.prepare import ensure_model
    from sao.rl.training.build import run_training
    from sao.rl.training.report import draw, online_summary, read_run

    algos = args.algos.split(",")
    families, steps = args.families.split(","), [int(s) for s in args.steps.split(",")]
    console = Console(width=160)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    runs: dict[str, Path] = {}
    walls: dict[str, float] = {}
    model = ensure_model("smollm2-135m")
    with VLLMServer(VLLMServerConfig(model=model, served_model_name="smollm2-135m", max_model_len=2048,
                                     kv_cache_gib=2, log_path=args.out / "vllm.log")) as server:
        for algo in algos:
            cfg = build_config(algo, args, server.root_url)
            run_dir = runs[algo] = args.out / algo
            if finished(run_dir, cfg.max_steps):
                console.print(f"[dim]{run_dir}: already finished, reused[/dim]")
                continue
            started = time.monotonic()
            run_training(replace(cfg, output_dir=str(run_dir), resume=True), run_dir)
            walls[algo] = time.monotonic() - started
            console.print(f"[bold]{run_dir}[/bold] done in {walls[algo]:.0f} s")
    wall = time.monotonic() - t0

    table = Table(title=f"online shift {' -> '.join(f'{f} ({n} steps)' for f, n in zip(families, steps))}, "
                        f"batch {args.batch}, seed {args.seed}")
    table.add_column("algo")
    for f in families:
        table.add_column(f"reward {f}", justify="right")
    for i in range(1, len(families)):
        table.add_column(f"lag shift {i}", justify="right")
    table.add_column("forgetting", justify="left")
    summary: dict[str, dict] = {}
    for algo, run_dir in runs.items():
        rows = read_run(run_dir)
        shifts, forgot = online_summary(rows, pre_window=args.pre_window)
        per_phase = phase_rewards(rows, families, steps)
        lags = [("-" if a.lag is None else str(a.lag)) + f" (pre {a.pre_level:.2f})" for a in shifts]
        forget = ", ".join(f"{f.family} {f.drop:+.2f}" for f in forgot.values()) or "-"
        table.add_row(algo, *[f"{r:.3f}" for r in per_phase], *lags, forget)
        summary[algo] = {"phase_reward": per_phase, "wall_s": walls.get(algo),
                         "shifts": [{"shift": a.shift, "pre_level": a.pre_level, "target": a.target, "lag": a.lag}
                                    for a in shifts],
                         "forgetting": {f.family: {"best": f.best, "best_step": f.best_step, "probe": f.probe,
                                                   "probe_step": f.probe_step, "drop": f.drop} for f in forgot.values()}}
    console.print(table)
    console.print("lag: steps after the shift until the step reward regains 80% of its pre-shift level "
                  "('-': not within the phase)")
    (args.out / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "wall_s": wall, "algos": summary}, indent=2) + "\n")
    draw(list(runs.values()), args.out / "curves.png", x="step", label="algo", smooth_window=3)
    console.print(f"wall {wall / 60:.1f} min; curves: {args.out / 'curves.png'}; summary: {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
