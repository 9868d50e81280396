"""``sao-report RUN_DIR`` / ``sao-report RUN_DIR... --out FILE.png``: learning curves of one or more runs, to PNG.

One run's figure goes into the run, ``RUN_DIR/report.png``; several runs' goes where ``--out`` says, and
without it sao-report refuses (exit 2) rather than guess which folder it belongs in. It prints the path alone on stdout; all else goes to stderr.

Reads each run's ``metrics.jsonl`` and draws one panel per metric that some run logged: reward,
accuracy, policy and value losses, the DIS mask fraction, the value model's explained variance,
the train-vs-rollout log-prob gap, sync time, and staleness or per-family reward when present.
The x axis is the policy step, or the number of trajectories trained on (``--x samples``), which
puts algorithms with different batch shapes on one scale. Runs that share a label (``--label algo``
takes it from each run's ``config.json``) are averaged, with their min-max as a band. For each run
with a critic it prints (to stderr) the mean explained variance over the defined steps
(:mod:`sao.rl.training.critic_summary`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from sao.rl.errors import ReportError
from sao.rl.training.critic_summary import critic_summary
from sao.rl.training.metrics_log import read_jsonl

PANELS = (
    ("reward/mean", "reward (mean)"),
    ("reward/accuracy", "accuracy"),
    ("loss/policy", "policy loss"),
    ("loss/value", "value loss"),
    ("dis/mask_frac", "DIS mask fraction"),
    ("value/explained_var", "value explained variance"),
    ("value/explained_var_first", "value EV, first action token"),
    ("rollout/logprob_gap", "|logp train - logp rollout|"),
    ("rollout/staleness_max", "staleness (max)"),
    ("rollout/response_tokens_mean", "response tokens"),
    ("perf/sync_s", "weight sync (s)"),
)


def read_run(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ReportError(f"{run_dir}: no metrics.jsonl (is this a sao-train run folder?)")
    return read_jsonl(path, warn=True)


def run_label(run_dir: Path, how: str) -> str:
    if how == "dir":
        return Path(run_dir).name
    config_path = Path(run_dir) / "config.json"
    if not config_path.is_file():
        return Path(run_dir).name
    config = json.loads(config_path.read_text())
    node: Any = config
    for part in how.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and "name" in node:
        node = node["name"]
    return str(node) if node is not None else Path(run_dir).name


def series(rows: list[dict[str, Any]], key: str, x: str, batch_size: int | None) -> tuple[list[float], list[float]]:
    xs, ys, seen = [], [], 0.0
    for row in rows:
        seen += row.get("rollout/trajectories") or (batch_size or 0)
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            xs.append(seen if x == "samples" else row["step"])
            ys.append(float(value))
    return xs, ys


def smooth(ys: list[float], window: int) -> list[float]:
    if window <= 1:
        return ys
    out = []
    for i in range(len(ys)):
        chunk = ys[max(0, i - window + 1):i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def family_keys(runs: list[list[dict[str, Any]]]) -> list[str]:
    """Per-family reward and probe keys any run logged (online-learning schedules)."""
    return sorted({k for rows in runs for row in rows for k in row
                   if k.startswith(("reward/family/", "probe/family/"))})


def online_summary(rows: list[dict[str, Any]], pre_window: int = 5) -> tuple[list[Any], dict[str, Any]]:
    """(adaptation per phase shift, forgetting per earlier family) of one run, from its metrics."""
    from sao.rl.prompts.curriculum import adaptation_lag, forgetting, history_from_metrics, phase_shifts

    phases = {r["step"]: r["schedule/phase"] for r in rows if r.get("schedule/phase") is not None}
    history = history_from_metrics(rows)
    if not history:
        return [], {}
    return adaptation_lag(history, phase_shifts(phases), pre_window), forgetting(history)


def _shift_steps(rows: list[dict[str, Any]]) -> list[int]:
    phases = [(r["step"], r["schedule/phase"]) for r in rows if r.get("schedule/phase") is not None]
    return [b for (_, pa), (b, pb) in zip(phases, phases[1:]) if pb != pa]


def draw(run_dirs: list[Path], out: Path, *, x: str = "step", label: str = "dir", smooth_window: int = 1) -> list[str]:
    """Write the figure; returns the metric keys drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_run(d) for d in run_dirs]
    labels = [run_label(d, label) for d in run_dirs]
    batch_sizes = []
    for d in run_dirs:
        cfg_path = Path(d) / "config.json"
        batch_sizes.append(json.loads(cfg_path.read_text()).get("batch_size") if cfg_path.is_file() else None)
    panels = [(k, t) for k, t in PANELS if any(series(r, k, x, b)[1] for r, b in zip(runs, batch_sizes))]
    panels += [(k, k.split("/family/")[1] + (" probe reward" if k.startswith("probe/") else " reward"))
               for k in family_keys(runs)]
    if not panels:
        raise ReportError("none of the runs logged a metric this report draws")
    cols = min(3, len(panels))
    rows_n = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.2 * cols, 3.4 * rows_n), squeeze=False)
    grouped: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(labels):
        grouped[name].append(i)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, title) in zip(axes.flat, panels):
        for c, (name, members) in enumerate(grouped.items()):
            curves = [series(runs[i], key, x, batch_sizes[i]) for i in members]
            curves = [(xs, smooth(ys, smooth_window)) for xs, ys in curves if ys]
            if not curves:
                continue
            color = colors[c % len(colors)]
            if len(curves) == 1:
                ax.plot(curves[0][0], curves[0][1], label=name, color=color)
                continue
            n = min(len(xs) for xs, _ in curves)  # average where every member has a point
            xs = curves[0][0][:n]
            stacked = [ys[:n] for _, ys in curves]
            mean = [sum(col) / len(col) for col in zip(*stacked)]
            ax.plot(xs, mean, label=f"{name} (n={len(curves)})", color=color)
            ax.fill_between(xs, [min(col) for col in zip(*stacked)], [max(col) for col in zip(*stacked)],
                            color=color, alpha=0.2)
        if x == "step":  # phase shifts of the first run with a schedule
            for shift in next((v for v in map(_shift_steps, runs) if v), []):
                ax.axvline(shift, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("trajectories" if x == "samples" else "policy step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [k for k, _ in panels]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sao-report", description="Plot learning curves of sao-train runs to a PNG.")
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (each with metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the PNG to write (default with one run: RUN_DIR/report.png; required with several)")
    parser.add_argument("--x", choices=("step", "samples"), default="step", help="x axis: policy step or trajectories")
    parser.add_argument("--label", default="dir",
                        help="legend label: 'dir' (folder name) or a config.json key such as 'algo' or 'seed'; "
                             "runs with the same label are averaged")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window")
    return parser


def out_path(runs: list[Path], out: Path | None) -> Path:
    """Where the figure goes: ``out``, else the one run's ``report.png``; several runs need ``out``."""
    if out is not None:
        return out
    if len(runs) > 1:
        raise ReportError(f"{len(runs)} runs: say where their figure goes with --out FILE.png (one run's goes "
                          "into its folder, RUN_DIR/report.png)")
    return Path(runs[0]) / "report.png"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = out_path(args.runs, args.out)
        drawn = draw(args.runs, out, x=args.x, label=args.label, smooth_window=args.smooth)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    print(f"{len(args.runs)} run(s); panels: {', '.join(drawn)}", file=sys.stderr)
    for run_dir in args.runs:
        rows = read_run(run_dir)
        for critic in critic_summary(rows):
            print(f"{run_dir}: {critic.describe()}", file=sys.stderr)
        shifts, forgot = online_summary(rows)
        for a in shifts:
            lag = "not regained" if a.lag is None else f"{a.lag} steps"
            print(f"{run_dir}: shift at step {a.shift}: pre-shift reward {a.pre_level:.3f}, "
                  f"80% regained after {lag}", file=sys.stderr)
        for f in forgot.values():
            print(f"{run_dir}: {f.family}: best {f.best:.3f} (step {f.best_step}), latest probe {f.probe:.3f} "
                  f"(step {f.probe_step}): forgetting {f.drop:+.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
