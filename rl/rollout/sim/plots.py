"""Timeline plots of a simulated run: each replica's busy/sync/dead intervals and the trainer's steps.

Uses matplotlib's Agg backend (no display). With many replicas only the first ``max_engines`` rows
are drawn (they are statistically alike); the title says how many are shown.
"""

from __future__ import annotations

from pathlib import Path

from sao.rl.rollout.sim.metrics import SimResult

COLORS = {"busy": "tab:green", "sync": "tab:orange", "dead": "tab:red"}


def plot_timeline(result: SimResult, path: Path, max_engines: int = 32) -> Path:
    """Write ``path`` (PNG) for a result simulated with ``record_timeline=True``."""
    if result.timeline is None:
        raise ValueError(f"{result.mode}: no timeline was recorded (simulate with record_timeline=True)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result.timeline
    shown = sorted(tl.engines)[:max_engines]
    fig, ax = plt.subplots(figsize=(12, 1.5 + 0.18 * len(shown)))
    for row, rid in enumerate(shown):
        for state, color in COLORS.items():
            spans = [(a, b - a) for a, b, s in tl.engines[rid] if s == state and b > a]
            if spans:
                ax.broken_barh(spans, (row + 0.1, 0.8), facecolors=color, linewidth=0)
    trainer_row = len(shown) + 0.5
    spans = [(a, b - a) for a, b, _ in tl.trainer if b > a]
    ax.broken_barh(spans, (trainer_row, 1.2), facecolors="tab:blue", edgecolor="white", linewidth=0.3)
    ax.set_yticks([*(r + 0.5 for r in range(len(shown))), trainer_row + 0.6])
    ax.set_yticklabels([*(f"engine {rid}" for rid in shown), "trainer"], fontsize=6)
    ax.set_xlabel("simulated time (s)")
    ax.set_xlim(0, result.wall_s)
    ax.set_title(f"{result.mode}: {len(shown)} of {result.engines} engines (green decode, orange sync, red dead; "
                 f"blue trainer)  -  {result.trajectories_per_hour:,.0f} trajectories/h, "
                 f"trainer idle {result.trainer_idle_ratio:.0%}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
