"""Rollout modes by scale, in the simulator: the table behind the orchestration goals.

    python benchmarks/pipeline_sim.py [--scenario paper_like] [--engines 8,64,256,1024] [--steps N]
                                      [--batch-per-engine B] [--json OUT.json] [--pipe-sweep]

Runs ``sync``, ``one_step_off``, ``async_drop`` (stale policy ``drop``) and ``async_mask`` (``mask``, the default),
``multi_version``, ``pipe`` (and ``pipe``'s baseline ``sync_grpo``) at each engine count with the same workload, batch size and number of steps, prints
the mode x engines table and the comparisons with the goals (async >= 3x sync trajectories/h with
trainer idle <= 5% at 256 engines; multi_version >= 1.3x one_step_off; pipe cuts
rollout-to-train-end by >= 40% and trainer waiting by >= 60% vs sync GRPO).

``--batch-per-engine B`` scales the batch with the fleet (B trajectories per engine per step, whole
GRPO groups); without it every scale trains on the scenario's fixed batch, which leaves most of a
large fleet idle in every mode.

``--pipe-sweep`` also varies the trainer's speed at 64 engines: CGP can only hide training time
behind the rollout, so pipe's gain depends on how long training is next to the rollout's tail.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sao.rl.rollout.sim.compare import comparisons, grid_json, render, run_grid
from sao.rl.rollout.sim.config import SCENARIOS, scenario
from sao.rl.rollout.sim.simulator import simulate

MODES = ["sync", "one_step_off", "async_drop", "async_mask", "multi_version", "pipe"]


def pipe_sweep(config, engines: int, console: Console) -> None:
    t = Table(title=f"pipe vs sync_grpo at {engines} engines as the trainer slows down")
    for c in ("trainer tokens/s", "train s / step (sync_grpo)", "rollout s / step (sync_grpo)",
              "rollout->train end cut", "trainer waiting cut"):
        t.add_column(c, justify="right")
    base = config.trainer.tokens_per_s
    for factor in (1, 4, 10, 25):
        cfg = replace(config, trainer=replace(config.trainer, tokens_per_s=base / factor))
        results = {m: simulate(m, cfg, engines) for m in ("pipe", "sync_grpo")}
        c = comparisons(results)["pipe"]
        s = results["sync_grpo"]
        train = (1 - s.trainer_idle_ratio) * s.wall_s / s.steps
        rollout = s.trainer_wait_ratio * s.wall_s / s.steps
        t.add_row(f"{base / factor:,.0f}", f"{train:,.0f}", f"{rollout:,.0f}",
                  f"{c['rollout_to_train_end_reduction_vs_sync_grpo']['value']:.1%}",
                  f"{c['trainer_wait_reduction_vs_sync_grpo']['value']:.1%}")
    console.print(t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="paper_like", choices=sorted(SCENARIOS))
    p.add_argument("--engines", default="8,64,256,1024")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-per-engine", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--pipe-sweep", action="store_true")
    args = p.parse_args()
    config = scenario(args.scenario)
    if args.steps:
        config = replace(config, steps=args.steps)
    console = Console(width=max(Console().width, 150))
    engines = [int(x) for x in args.engines.split(",")]
    t0 = time.perf_counter()
    grid = run_grid(MODES, engines, config, batch_per_engine=args.batch_per_engine)
    batch = (f"{args.batch_per_engine} trajectories per engine" if args.batch_per_engine
             else config.scheduler.batch_size)
    console.print(f"{args.scenario}: batch {batch}, {config.steps} steps, k = "
                  f"{config.scheduler.staleness} ({config.scheduler.stale_policy}), GRPO groups of "
                  f"{config.grpo_group_size}; simulated in {time.perf_counter() - t0:.0f} s")
    render(grid, console)
    if args.json:
        args.json.write_text(json.dumps(grid_json(grid), indent=2))
    if args.pipe_sweep:
        pipe_sweep(config, 64, console)


if __name__ == "__main__":
    main()
