"""DORA's rebalancing in the simulator: moving stragglers off old-version replicas vs the two admission rules.

    python benchmarks/dora_rebalancing.py [--scenario paper_like] [--engines 64,256]
                                          [--batch-per-engine 0,4] [--steps N] [--json OUT.json]

Runs three ``multi_version`` variants at each engine count and batch regime, same workload and seed:

* ``lag 0`` (``multi_version``, ``admit_lag=0``, the default rule of METHOD.md 2): new trajectories start on the
  newest version only; an old replica drains alone until its last straggler ends;
* ``lag 2`` (``multi_version_lag``, ``admit_lag=2``): old replicas up to 2 versions behind keep admitting;
* ``rebalance`` (``multi_version_rebalance``, ``admit_lag=0``): a draining old replica holding at most
  ``drain_below * max_concurrency`` trajectories moves them to its peers of the same version and
  upgrades at once (``MoveTrajectory``; the target prefills each moved sequence again).

Prints, side by side: replica-seconds spent draining (old version, work in flight, nothing new
admitted) and their share of all replica-time, trained tokens/s (and the ratio to ``lag 0``),
staleness mean/max, moves and the prefix tokens they recomputed, and ``lost`` (must be 0).
``--batch-per-engine 0`` is the scenario's fixed batch; B > 0 scales the batch to B trajectories per
engine per step. Each run checks the scheduler's ledger every 1,000 events.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sao.rl.rollout.sim.compare import scaled
from sao.rl.rollout.sim.config import SCENARIOS, scenario
from sao.rl.rollout.sim.simulator import Simulation

VARIANTS = (("lag 0", "multi_version", 0), ("lag 2", "multi_version_lag", 2),
            ("rebalance", "multi_version_rebalance", 0))  # (label, sao-sim mode, admit_lag)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="paper_like", choices=sorted(SCENARIOS))
    p.add_argument("--engines", default="64,256")
    p.add_argument("--batch-per-engine", default="0,4", help="comma list; 0 = the scenario's fixed batch")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    config = scenario(args.scenario)
    if args.steps:
        config = replace(config, steps=args.steps)
    console = Console(width=max(Console().width, 200))
    t = Table(title=f"{args.scenario}: multi_version, k = {config.scheduler.staleness}, {config.steps} steps, "
                    f"drain_below = {config.scheduler.drain_below}, max_concurrency = {config.scheduler.max_concurrency}")
    for c in ("engines", "batch", "variant", "draining replica-s", "draining share", "trained tokens/s",
              "vs lag 0", "staleness mean", "staleness max", "moves", "move prefill tokens",
              "old-version starts", "lost", "mixed"):
        t.add_column(c, justify="right", no_wrap=True)
    rows = []
    t0 = time.perf_counter()
    for n in (int(x) for x in args.engines.split(",")):
        for bpe in (int(x) for x in args.batch_per_engine.split(",")):
            cfg = scaled(config, n, bpe or None)
            base = None
            for label, mode, lag in VARIANTS:
                c = replace(cfg, scheduler=replace(cfg.scheduler, admit_lag=lag))
                r = Simulation(mode, c, n, check_every=1000).run()
                base = base or r.tokens_per_s
                rows.append({"engines": n, "batch": c.scheduler.batch_size, "variant": label, **r.to_json()})
                t.add_row(str(n), str(c.scheduler.batch_size), label, f"{r.drain_replica_s:,.0f}",
                          f"{r.drain_share:.1%}", f"{r.tokens_per_s:,.0f}", f"{r.tokens_per_s / base:.3f}x",
                          f"{r.mean_staleness:.2f}", str(r.max_staleness), f"{r.moves:,}",
                          f"{r.move_prefill_tokens:,}", f"{r.old_version_start_share:.1%}", str(r.lost),
                          str(r.mixed_version))
            t.add_section()
    console.print(t)
    console.print(f"simulated in {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
