"""``sao-sim``: simulate the rollout modes at one or several scales and compare them.

    sao-sim --modes sync,one_step_off,async,multi_version,pipe --engines 256 --json OUT.json
    sao-sim --engines 8,64,256,1024 --scenario paper_like --plot plots/

Writes OUT.json (shape in :mod:`sao.rl.rollout.compare`: ``{mode: metrics}`` for one engine count,
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

from sao.rl.rollout.core import STALE_POLICIES, ConfigError, RolloutError
from sao.rl.rollout.simconfig import SCENARIOS, scenario

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
                   help=f"comma list of modes (default {DEFAULT_MODES}; also async_mask, sync_grpo); "
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
    p.add_argument("--stale-policy", choices=STALE_POLICIES, default=None, help="async: drop or mask stale trajectories")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--plot", type=Path, default=None, help="write timeline PNGs into this folder")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rich.console import Console

    from sao.rl.rollout.compare import grid_json, render, resolve_modes, run_grid

    console = Console(width=max(Console().width, 150))
    try:
        config = scenario(args.scenario)
        sched = config.scheduler
        overrides = {k: v for k, v in (("batch_size", args.batch_size), ("staleness", args.staleness),
                                       ("stale_policy", args.stale_policy)) if v is not None}
        if overrides:
            config = replace(config, scheduler=replace(sched, **overrides))
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
