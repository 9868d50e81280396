"""``sao-sim``: simulate the rollout modes at one or several scales and compare them.

    sao-sim --modes sync,one_step_off,async,multi_version,pipe --engines 256 --json OUT.json
    sao-sim --engines 8,64,256,1024 --scenario paper_like --plot plots/
    sao-sim --modes multi_version,multi_version_lag --engines 256       # admission rules side by side
    sao-sim --modes async_drop,async_mask --engines 256                  # stale policies: lengths trained
    sao-sim --modes async --engines 2,256 --router cache_aware --cache-tokens 60000 --flush-on-sync

Writes OUT.json (shape in :mod:`sao.rl.rollout.sim.compare`: ``{mode: metrics}`` for one engine count,
``{"<engines>": {mode: metrics}}`` for several), prints rich tables, and the ratios against the
goals. Bad input exits 2 with a message saying what to change.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

from sao.agents.routing import ROUTERS
from sao.rl.errors import ConfigError, RolloutError
from sao.rl.rollout.schedulers import STALE_POLICIES
from sao.rl.rollout.sim import SCENARIOS, scenario

DEFAULT_MODES = "sync,one_step_off,async,multi_version,pipe"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers like 8,64,256, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"engine counts must be positive integers, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sao-sim", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=DEFAULT_MODES,
                   help=f"comma list of modes (default {DEFAULT_MODES}; also async_mask, async_drop, multi_version_lag, "
                        "multi_version_rebalance, "
                        "sync_grpo); "
                        "pipe adds its baseline sync_grpo")
    p.add_argument("--engines", type=_int_list, default=[256], help="engine replicas, a comma list (default 256)")
    p.add_argument("--scenario", default="paper_like", choices=sorted(SCENARIOS))
    p.add_argument("--seed", type=_positive, default=0)
    p.add_argument("--steps", type=_positive, default=None, help="optimizer steps to simulate (default: the scenario's)")
    p.add_argument("--batch-size", type=_positive, default=None, help="trajectories per step (default: the scenario's)")
    p.add_argument("--batch-per-engine", type=_positive, default=None,
                   help="scale the batch with the fleet: this many trajectories per engine per step "
                        "(default: the scenario's fixed batch)")
    p.add_argument("--staleness", type=_positive, default=None, help="staleness bound k (default: the scenario's, 4)")
    p.add_argument("--stale-policy", choices=STALE_POLICIES, default=None, help="async: drop (default) or mask stale trajectories")
    p.add_argument("--trainer-tps", type=_positive, default=None,
                   help="the trainer's tokens/s (default: the scenario's); a fast trainer makes the rollout the bottleneck")
    p.add_argument("--admit-lag", type=_positive, default=None,
                   help="multi_version: start new trajectories on replicas up to this many versions behind "
                        "(default 0: newest version only, METHOD.md 2)")
    p.add_argument("--router", choices=ROUTERS, default=None,
                   help="where later turns run (default pinned: on the replica the trajectory started on)")
    p.add_argument("--cache-tokens", type=_positive, default=None,
                   help="each replica's prefix cache in tokens, LRU (default: unbounded)")
    p.add_argument("--flush-on-sync", action="store_true", help="a weight load empties the replica's prefix cache")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--plot", type=Path, default=None, help="write timeline PNGs into this folder")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rich.console import Console

    from sao.rl.rollout.sim.compare import grid_json, render, resolve_modes, run_grid

    console = Console(width=max(Console().width, 150))
    try:
        config = scenario(args.scenario)
        sched = config.scheduler
        overrides = {k: v for k, v in (("batch_size", args.batch_size), ("staleness", args.staleness),
                                       ("stale_policy", args.stale_policy), ("admit_lag", args.admit_lag))
                     if v is not None}
        if overrides:
            config = replace(config, scheduler=replace(sched, **overrides))
        routing = {k: v for k, v in (("router", args.router), ("cache_tokens", args.cache_tokens),
                                     ("flush_on_sync", args.flush_on_sync or None)) if v is not None}
        if routing:
            config = replace(config, routing=replace(config.routing, **routing))
        if args.trainer_tps:
            config = replace(config, trainer=replace(config.trainer, tokens_per_s=float(args.trainer_tps)))
        if args.steps is not None:
            config = replace(config, steps=args.steps)
        modes = resolve_modes([m.strip() for m in args.modes.split(",") if m.strip()])
        grid = run_grid(modes, args.engines, config, plot_dir=args.plot, batch_per_engine=args.batch_per_engine)
    except ConfigError as exc:
        print(f"sao-sim: error: {exc}", file=sys.stderr)
        return 2
    except RolloutError as exc:  # a scheduler broke an invariant: a bug, say so plainly
        print(f"sao-sim: the simulation failed: {exc}", file=sys.stderr)
        return 1
    render(grid, console)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(grid_json(grid), indent=2))
        console.print(f"wrote {args.json}")
    if args.plot is not None:
        console.print(f"timelines in {args.plot}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
