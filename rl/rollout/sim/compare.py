"""Run a grid of (mode, engine count) simulations and compare the modes with the project's goals.

Comparisons (same workload, batch size and number of steps, hence the same sample budget):

* ``async`` (and ``async_mask``, ``async_drop``) vs ``sync``: trajectories/h ratio (goal >= 3x at 256 engines,
  with the trainer idle <= 5%); the tokens/s ratio is reported beside it because dropping stale
  trajectories favours short ones.
* ``multi_version`` vs ``one_step_off``: trajectories/h ratio (goal >= 1.3x).
* ``pipe`` vs ``sync_grpo`` (both GRPO groups, on-policy): reduction of ``rollout_to_train_end_s``
  (goal >= 40%) and of ``trainer_wait_ratio`` (goal >= 60%).

JSON shape (:func:`grid_json`): one engine count gives ``{mode: {metric: value, ..., "ratios":
{...}}}``; several give ``{"<engines>": {mode: {...}}}``. ``ratios`` sits on the mode that is the
numerator of a comparison. Requesting ``pipe`` adds its baseline ``sync_grpo``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sao.rl.rollout.schedulers import ConfigError, unknown_name
from sao.rl.rollout.sim.config import SimConfig
from sao.rl.rollout.sim.metrics import SimResult
from sao.rl.rollout.sim.simulator import SIM_MODES, simulate

log = logging.getLogger(__name__)

Grid = dict[int, dict[str, SimResult]]

# (name, numerator, baseline, metric, kind, goal, label): kind "ratio" = a / b, "reduction" = 1 - a / b
COMPARISONS: tuple[tuple[str, str, str, str, str, float | None, str], ...] = (
    ("trajectories_per_hour_vs_sync", "async", "sync", "trajectories_per_hour", "ratio", 3.0,
     "async / sync trajectories/h"),
    ("tokens_per_s_vs_sync", "async", "sync", "tokens_per_s", "ratio", None, "async / sync trained tokens/s"),
    ("trajectories_per_hour_vs_sync", "async_mask", "sync", "trajectories_per_hour", "ratio", 3.0,
     "async_mask / sync trajectories/h"),
    ("tokens_per_s_vs_sync", "async_mask", "sync", "tokens_per_s", "ratio", None, "async_mask / sync trained tokens/s"),
    ("trajectories_per_hour_vs_sync", "async_drop", "sync", "trajectories_per_hour", "ratio", 3.0,
     "async_drop / sync trajectories/h"),
    ("tokens_per_s_vs_sync", "async_drop", "sync", "tokens_per_s", "ratio", None, "async_drop / sync trained tokens/s"),
    ("trajectories_per_hour_vs_one_step_off", "multi_version", "one_step_off", "trajectories_per_hour", "ratio", 1.3,
     "multi_version / one_step_off trajectories/h"),
    ("rollout_to_train_end_reduction_vs_sync_grpo", "pipe", "sync_grpo", "rollout_to_train_end_s", "reduction", 0.40,
     "pipe vs sync_grpo: rollout-to-train-end cut"),
    ("trainer_wait_reduction_vs_sync_grpo", "pipe", "sync_grpo", "trainer_wait_ratio", "reduction", 0.60,
     "pipe vs sync_grpo: trainer waiting cut"),
)
LABELS = {(c[1], c[0]): c[6] for c in COMPARISONS}
ASYNC_IDLE_GOAL = 0.05


def resolve_modes(modes: Sequence[str]) -> list[str]:
    """Validate mode names; ``pipe`` brings its baseline ``sync_grpo``."""
    if not modes:
        raise ConfigError("no modes given")
    out: list[str] = []
    for m in modes:
        if m not in SIM_MODES:
            raise unknown_name("mode", m, tuple(SIM_MODES))
        if m not in out:
            out.append(m)
    if "pipe" in out and "sync_grpo" not in out:
        out.append("sync_grpo")
    return out


def scaled(config: SimConfig, engines: int, batch_per_engine: int | None) -> SimConfig:
    """``config`` with a batch of ``batch_per_engine`` trajectories per engine (rounded up to whole GRPO
    groups), so a bigger fleet gets a proportionally bigger batch; unchanged when None."""
    if batch_per_engine is None:
        return config
    g = config.grpo_group_size
    batch = max(g, -(-batch_per_engine * engines // g) * g)
    return replace(config, scheduler=replace(config.scheduler, batch_size=batch))


def run_grid(modes: Sequence[str], engines: Sequence[int], config: SimConfig, plot_dir: Path | None = None,
             batch_per_engine: int | None = None) -> Grid:
    """Simulate every mode at every engine count (timelines as PNGs in ``plot_dir`` if given).
    ``batch_per_engine``: scale the batch with the fleet (see :func:`scaled`)."""
    if not engines or any(n < 1 for n in engines):
        raise ConfigError(f"engine counts must be >= 1, got {list(engines)}")
    grid: Grid = {}
    for n in engines:
        grid[n] = {}
        for mode in resolve_modes(modes):
            result = simulate(mode, scaled(config, n, batch_per_engine), n, record_timeline=plot_dir is not None)
            if plot_dir is not None:
                from sao.rl.rollout.sim.plots import plot_timeline

                plot_timeline(result, Path(plot_dir) / f"timeline_{mode}_{n}.png")
                result = replace(result, timeline=None)
            grid[n][mode] = result
    return grid


def comparisons(results: dict[str, SimResult]) -> dict[str, dict[str, Any]]:
    """Per numerator mode: ``{name: {"value", "goal", "met"}}`` for the comparisons it takes part in."""
    out: dict[str, dict[str, Any]] = {}
    for name, a, b, metric, kind, goal, _ in COMPARISONS:
        if a not in results or b not in results:
            continue
        x, y = getattr(results[a], metric), getattr(results[b], metric)
        value = (x / y if y else float("inf")) if kind == "ratio" else (1.0 - x / y if y else 0.0)
        entry: dict[str, Any] = {"value": value, "goal": goal, "met": None if goal is None else value >= goal}
        if name == "trajectories_per_hour_vs_sync":
            idle = results[a].trainer_idle_ratio
            entry["trainer_idle_ratio"] = idle
            entry["met"] = value >= goal and idle <= ASYNC_IDLE_GOAL
            entry["goal"] = f">= {goal}x with trainer idle <= {ASYNC_IDLE_GOAL:.0%}"
        out.setdefault(a, {})[name] = entry
    return out


def grid_json(grid: Grid) -> dict[str, Any]:
    """The JSON document (shape in the module docstring)."""
    def one(results: dict[str, SimResult]) -> dict[str, Any]:
        ratios = comparisons(results)
        doc = {}
        for mode, r in results.items():
            doc[mode] = r.to_json()
            if mode in ratios:
                doc[mode]["ratios"] = ratios[mode]
        return doc

    if len(grid) == 1:
        return one(next(iter(grid.values())))
    return {str(n): one(results) for n, results in grid.items()}


def render(grid: Grid, console) -> None:
    """Print the results (rich tables) and the comparisons with the goals."""
    from rich.table import Table

    engines = list(grid)
    modes = list(next(iter(grid.values())))
    if len(engines) == 1:
        results = grid[engines[0]]
        t = Table(title=f"{engines[0]} engines")
        cols = ("traj/h", "tok/s", "trainer idle", "trainer wait", "engine busy", "stale max/mean",
                "rollout->train end s", "admitted", "trained", "requeued (stale)", "failed", "lost")
        t.add_column("mode")
        for c in cols:
            t.add_column(c, justify="right")
        for m, r in results.items():
            t.add_row(m, f"{r.trajectories_per_hour:,.0f}", f"{r.tokens_per_s:,.0f}", f"{r.trainer_idle_ratio:.1%}",
                      f"{r.trainer_wait_ratio:.1%}", f"{r.engine_busy_ratio:.1%}",
                      f"{r.max_staleness}/{r.mean_staleness:.2f}", f"{r.rollout_to_train_end_s:,.0f}",
                      str(r.admitted), str(r.trained), f"{r.requeued} ({r.dropped_stale})", str(r.failed), str(r.lost))
        console.print(t)
    else:
        t = Table(title="trajectories/h  (trainer idle, max staleness)  by mode x engines")
        t.add_column("mode")
        for n in engines:
            t.add_column(f"{n} engines", justify="right")
        for m in modes:
            t.add_row(m, *(f"{grid[n][m].trajectories_per_hour:,.0f} ({grid[n][m].trainer_idle_ratio:.0%}, "
                           f"{grid[n][m].max_staleness})" for n in engines))
        console.print(t)
    render_details(grid, console)
    t = Table(title="comparisons with the goals")
    t.add_column("comparison")
    t.add_column("goal")
    for n in engines:
        t.add_column(f"{n} engines", justify="right")
    rows: dict[str, list[str]] = {}
    goals: dict[str, str] = {}
    for n in engines:
        for mode, entries in comparisons(grid[n]).items():
            for name, e in entries.items():
                label = LABELS[(mode, name)]
                g = e["goal"]
                goals[label] = ("-" if g is None else g if isinstance(g, str) else
                                f">= {g:.0%}" if "reduction" in name else f">= {g:g}x")
                mark = "" if e["met"] is None else " ok" if e["met"] else " MISSED"
                value = f"{e['value']:.2f}x" if "reduction" not in name else f"{e['value']:.1%}"
                if "trainer_idle_ratio" in e:
                    value += f" (idle {e['trainer_idle_ratio']:.0%})"
                rows.setdefault(label, []).append(value + mark)
    for label, cells in rows.items():
        t.add_row(label, goals[label], *cells)
    if rows:
        console.print(t)


def render_details(grid: Grid, console) -> None:
    """Admission, prefix cache and length bias per mode and engine count (definitions in :mod:`metrics`)."""
    from rich.table import Table

    t = Table(title="admission, prefix cache, lengths (action tokens: mean / p90, share above the median)")
    for c in ("engines", "mode", "old-version starts", "cache hit (tokens)", "later turns hit", "moves",
              "admitted", "generated", "trained", "dropped", "long share adm/gen/trained/dropped"):
        t.add_column(c, justify="right" if c != "mode" else "left")
    for n, results in grid.items():
        for m, r in results.items():
            L = r.lengths

            def cell(name: str) -> str:
                if not L.get(f"rollout/len_{name}_n"):
                    return "-"
                return f"{L[f'rollout/len_{name}_mean']:,.0f} / {L[f'rollout/len_{name}_p90']:,.0f}"

            shares = "/".join(f"{L.get(f'rollout/len_{k}_long_share', 0.0):.0%}" if L.get(f"rollout/len_{k}_n") else "-"
                              for k in ("admitted", "generated", "trained", "dropped"))
            t.add_row(str(n), m, f"{r.old_version_starts} ({r.old_version_start_share:.1%})",
                      f"{r.prefix_cache_hit_rate:.1%}", f"{r.prefix_turn_hit_rate:.1%}", str(r.routed_moves),
                      cell("admitted"), cell("generated"), cell("trained"),
                      f"{cell('dropped')} (n={int(L.get('rollout/len_dropped_n', 0))})", shares)
    console.print(t)
