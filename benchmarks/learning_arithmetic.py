"""SAO vs GRPO with DIS vs GRPO on generated arithmetic: held-out accuracy at equal samples. Not in CI.

    .venv/bin/python benchmarks/learning_arithmetic.py [--budget 432] [--seeds 1,2,3,4,5] [--algos sao,grpo_dis]
        [--lora] [--skip-equal] [--eval-problems N] [--out runs/learning_arithmetic] [--set KEY=VALUE ...]

What runs. Every run is ``sao-train``'s composed default configuration (Hydra compose of
``config``, so it follows whatever the defaults become: lr, env, batch, engine dtype) with only
what the comparison needs overridden: ``algo``, ``seed``, the step count from ``--budget``,
``algo.group_size`` (``--group``), ``eval.every`` (``--eval-points``), ``engine.base_url`` and
the logging. Every algorithm sees the same number of trajectories (``--budget``): SAO spends its
``value_pretrain_steps`` critic-only batches inside the budget and the rest on policy steps; GRPO
variants take ``budget / batch`` steps of ``batch / group`` prompts x ``group``. ``--lora`` adds
``sao+lora``: SAO with ``model.lora.rank=8`` and ``optim.lr=--lora-lr`` (2e-4, the top of the
the 1e-4..2e-4 range for LoRA in docs/guides/train.md), on ``--lora-seeds`` (default one seed: fewer than the others).
``--skip-equal`` adds ``sao-skip-equal``: SAO with ``algo.step_on_equal_rewards=false``, on ``--seeds``.

One managed local vLLM, started in dev mode from an untied copy of the model in the composed
``model.engine_dtype`` (``OUT/engine_model``, as sao-train's own engines), serves every
run in turn (``--engines N`` starts N and runs N at a time, for a GPU); each run first syncs its
own initial weights into it, so runs do not leak into each other. Each run is its own process, so
its peak RSS (``perf/rss_gb``) and wall time are its own. A finished run folder is reused and an
unfinished one resumed (``resume=true``), so an interrupted benchmark continues where it stopped;
a folder made with a different configuration is refused. ``--deadline-s`` stops whatever is still
training at that wall time and reports the evaluations made so far (marked unfinished).

What is measured. sao-train evaluates held-out accuracy (``sao.rl.training.heldout``: the same
``eval.problems`` test-split problems, greedy) before the first step, every ``eval.every`` steps
and at the last step; x is the trajectories seen at that point (critic batches included).

- ``OUT/heldout.png``: per algorithm the mean over seeds, with the *pooled* 95% Wilson interval
  (correct answers summed over seeds x problems) as the band and each seed as a thin line, so
  the seeds' spread is visible beside the sampling interval.
- The table: the improvement (last - first held-out accuracy) per seed, and its mean over seeds
  with a 95% *t-interval over seeds* (mean +- t_{0.975, n-1} sd / sqrt(n)). That is the headline
  because the question is whether the algorithm improves a run, and run-to-run variation (seed:
  init of the critic, sampled rollouts, problem order) is the larger noise in RL; each seed's
  delta already carries its problems' sampling noise, so the t-interval covers both. With 3
  seeds it is wide (t = 4.30). Beside it, the *pooled paired* interval: the paired differences of
  every seed's problems taken as one sample (``sao.rl.training.heldout.paired_difference``); it is
  narrower but treats seeds as interchangeable and, when the held-out sets of different seeds
  overlap (a small problem space: 1-digit arithmetic has about 80 distinct test problems, the
  same for every seed), counts the same problem more than once, so it understates. With one
  seed only the pooled (= that run's paired) interval exists.
- Per algorithm, how many seeds *collapsed*: a later held-out evaluation more than 10 points below the
  run's own first (``learning_stats.collapsed``; a dip counts even if the run recovers).
- The *paired difference* of the first algorithm's improvement minus each other's, seed by seed (the same
  seed gives both the same held-out problems and prompt order): its mean with a t-interval over seeds,
  and beside it a normal interval over the pooled per-problem differences (``learning_stats.arm_difference``).
- With ``--lora``: the time (training only: rollouts, updates and syncs, evaluations excluded;
  mean over seeds) until the mean improvement first reaches full fine-tuning SAO's final mean
  improvement, or "not reached"; peak RSS and mean ``perf/sync_s``, LoRA against full.
- ``OUT/summary.json``: all of it, per seed and aggregated; ``OUT/curves.png``: sao-report's
  training panels (reward, losses, DIS mask, ...) against trajectories, per algorithm.

Sizing (defaults, 2 cores): on a 2-core AMD EPYC without AMX about 46 s per batch of 8 and 94 s per
evaluation of 200 problems (2026-12-07: sao seed 1 took 2,950 s); on an AMX Xeon about 16 s and 40 s.
432 trajectories (3x the main job's 144) = 54 batches, 5 evaluations: about 50 min a run on the EPYC, 15 runs
(3 arms x 5 seeds) about 12 h, so the benchmark spans sessions: the per-run folders under
``--out`` (keep them outside the checkout) are what it resumes from. The script prints its own estimate
from these figures before it starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from learning_stats import (COLLAPSE_DROP, CurvePoint, Improvement, arm_difference, collapsed, curve,  # noqa: F401
                            improvement_stats, paired_lists, t_interval, t_quantile)
from sao.rl.training.heldout import Interval, load_results
from sao.rl.training.metrics_log import read_jsonl

log = logging.getLogger("learning_arithmetic")

# for the printed estimate only, with the defaults (batch 8, SmolLM2-135M) on a 2-core AMD EPYC without AMX
# (2026-12-07, sao seed 1: 2,950 s for 54 batches and 5 evaluations of 200 problems, 74-154 s each); a 2-core
# AMX Xeon took about 16 s a batch and 40 s an evaluation
STEP_S, EVAL_S_PER_PROBLEM, RUN_OVERHEAD_S, ENGINE_START_S = 46.0, 94.0 / 200, 20.0, 60.0

@dataclass(frozen=True)
class Arm:
    """One compared configuration: a label, the ``algo`` option and its extra Hydra overrides."""

    label: str
    algo: str
    overrides: tuple[str, ...] = ()

    @property
    def slug(self) -> str:  # folder-safe
        return self.label.replace("+", "_")


def time_to_reach(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first time at which the improvement reaches ``target``, from (time, improvement) points
    in time order; None when it never does or the target is not a gain (<= 0, nan)."""
    if not target > 0:
        return None
    for t, gain in points:
        if gain >= target:
            return t
    return None


def train_seconds(metrics: Sequence[dict[str, Any]], pretrain: Sequence[dict[str, Any]]) -> dict[int, float]:
    """{step: training seconds up to the end of that step}: critic batches plus each step's
    ``perf/step_s`` less its evaluation's ``perf/eval_s`` (so the evaluations, which every arm runs
    alike, do not count); step 0 (before any policy step) is after the critic batches."""
    t = sum(float(r.get("perf/step_s") or 0.0) for r in pretrain)
    out = {0: t}
    for row in sorted((r for r in metrics if r.get("step", 0) >= 1), key=lambda r: r["step"]):
        t += float(row.get("perf/step_s") or 0.0) - float(row.get("perf/eval_s") or 0.0)
        out[int(row["step"])] = t
    return out


def trajectories_seen(step: int, batch: int, pretrain_steps: int) -> int:
    """Trajectories sampled before an evaluation at ``step``: none at 0, else the critic batches and
    ``step`` policy batches."""
    return 0 if step == 0 else (pretrain_steps + step) * batch


def eval_every(batches: int, points: int) -> int:
    """``eval.every`` so that a run of ``batches`` batches gets about ``points`` evaluations (step 0
    and the last included)."""
    return max(1, math.ceil(batches / max(1, points - 1)))


def interval_json(i: Interval) -> dict[str, float | None]:
    return {k: (None if math.isnan(v) else v) for k, v in (("value", i.value), ("low", i.low), ("high", i.high))}


# ---------------------------------------------------------------------------- configuration


def compose_base(sets: Sequence[str], extra: Sequence[str] = ()):  # type: ignore[no-untyped-def]
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train  # noqa: F401  (schema + resolvers)
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        return to_config(compose("config", overrides=[*sets, *extra]))


def build_config(arm: Arm, seed: int, args: argparse.Namespace, base_url: str):  # type: ignore[no-untyped-def]
    """sao-train's composed defaults with what the comparison needs: algo, seed, budget, group, eval
    schedule, engine, logging."""
    from sao.rl.algos import make_algorithm

    cfg = compose_base(args.set, [f"algo={arm.algo}", f"seed={seed}", *arm.overrides])
    critic = make_algorithm(cfg.algo).uses_critic
    batches = args.budget // cfg.batch_size
    pretrain = (cfg.value_pretrain_steps if args.pretrain is None else args.pretrain) if critic else 0
    if batches - pretrain < 1:
        raise SystemExit(f"--budget {args.budget} is {batches} batches of {cfg.batch_size}: no policy step is left "
                         f"after {pretrain} critic batches; raise --budget or lower --pretrain")
    algo = cfg.algo
    if algo.group_size > 1 and args.group:
        if cfg.batch_size % args.group:
            raise SystemExit(f"batch_size {cfg.batch_size} is not a multiple of --group {args.group}")
        algo = replace(algo, group_size=args.group)
    eval_cfg = replace(cfg.eval, enabled=True, every=eval_every(batches, args.eval_points),
                       problems=args.eval_problems or cfg.eval.problems)
    return replace(cfg, algo=algo, max_steps=batches - pretrain, value_pretrain_steps=pretrain, eval=eval_cfg,
                   keep_checkpoints=1, engine=replace(cfg.engine, base_url=base_url),
                   logger=replace(cfg.logger, console=True, tensorboard=None))


def _comparable(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """A config as config.json holds it, less what changes between attempts (the engine's port)."""
    d = json.loads(json.dumps(cfg_dict, default=str))
    d.pop("output_dir", None)
    d.pop("resume", None)
    d.get("engine", {}).pop("base_url", None)
    return d


def last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    steps = [-1]
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                steps.append(int(json.loads(line)["step"]))
            except (json.JSONDecodeError, KeyError, ValueError):
                continue
    return max(steps)


def check_folder(run_dir: Path, cfg: Any) -> str:
    """'new', 'finished' or 'resume'; exits when the folder holds a run of another configuration."""
    saved = run_dir / "config.json"
    if not saved.is_file():
        return "new"
    if _comparable(json.loads(saved.read_text())) != _comparable(asdict(cfg)):
        raise SystemExit(f"{run_dir} holds a run with a different configuration; remove it or choose another --out")
    return "finished" if last_step(run_dir) >= cfg.max_steps else "resume"


# ---------------------------------------------------------------------------- running


def _train(cfg: Any, run_dir: str) -> None:  # in a fresh process (spawn)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from sao.rl.training.build import run_training

    run_training(cfg, Path(run_dir))


@dataclass
class Job:
    arm: Arm
    seed: int
    run_dir: Path
    cfg: Any  # the run's TrainConfig; engine.base_url is set when an engine takes the job
    status: str = "pending"  # pending | finished | unfinished | failed | skipped
    wall_s: float = 0.0  # over all attempts, read back from bench.json


def read_bench(path: Path) -> dict[str, Any]:
    """A run's ``bench.json`` (wall time over its attempts); a missing or torn one (a benchmark stopped while
    writing it, before writes were atomic) counts as no attempt, with a warning: the run's own files decide
    whether it finished."""
    empty = {"wall_s": 0.0, "attempts": 0}
    if not path.is_file():
        return empty
    try:
        data = json.loads(path.read_text())
        return {**empty, **data} if isinstance(data, dict) else empty
    except json.JSONDecodeError:
        log.warning("%s is torn; its wall time is not counted", path)
        return empty


def run_job(job: Job, base_url: str, deadline: float, console: Console) -> None:
    """Train one run in its own process (or reuse it); record the wall time in RUN_DIR/bench.json."""
    cfg = replace(job.cfg, engine=replace(job.cfg.engine, base_url=base_url))
    state = check_folder(job.run_dir, cfg)
    bench = job.run_dir / "bench.json"
    prior = read_bench(bench)
    if state == "finished":
        job.status, job.wall_s = "finished", prior["wall_s"]
        console.print(f"[dim]{job.run_dir}: already finished, reused[/dim]")
        return
    if time.monotonic() >= deadline:
        job.status = "skipped"
        return
    started = time.monotonic()
    proc = multiprocessing.get_context("spawn").Process(
        target=_train, args=(replace(cfg, output_dir=str(job.run_dir), resume=state == "resume"), str(job.run_dir)),
        name=f"train-{job.run_dir.name}", daemon=True)  # daemon: it dies with the benchmark
    proc.start()
    try:
        proc.join(None if math.isinf(deadline) else max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            console.print(f"[yellow]{job.run_dir}: deadline reached, stopped[/yellow]")
    finally:  # the deadline, or this thread failing: the run does not outlive its job
        if proc.is_alive():
            proc.terminate()
            proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    wall = time.monotonic() - started
    job.wall_s = prior["wall_s"] + wall
    job.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = bench.with_suffix(".json.tmp")  # whole or not at all: the benchmark may be stopped at any point
    tmp.write_text(json.dumps({"wall_s": job.wall_s, "attempts": prior["attempts"] + 1, "exit_code": proc.exitcode}) + "\n")
    os.replace(tmp, bench)
    if last_step(job.run_dir) >= cfg.max_steps:
        job.status = "finished"
    else:
        job.status = "failed" if proc.exitcode not in (0, None, -15) else "unfinished"
    console.print(f"[bold]{job.run_dir}[/bold] {job.status} after {wall:.0f} s (exit {proc.exitcode})")


def run_all(jobs: list[Job], args: argparse.Namespace, console: Console) -> None:
    """Start ``--engines`` managed vLLMs (the main thread, one after another), then train the jobs
    in order, one per engine at a time."""
    from sao.agents.engine.server import VLLMServer, VLLMServerConfig
    from sao.rl.weights.export import export_model

    base = compose_base(args.set)
    deadline = time.monotonic() + (args.deadline_s or math.inf)
    todo: queue.Queue[Job] = queue.Queue()
    for job in jobs:
        todo.put(job)
    servers: list[VLLMServer] = []
    pending = [j for j in jobs if check_folder(j.run_dir, j.cfg) != "finished"]
    try:
        # the engines serve an untied copy (sao.rl.weights.sync: a tied head never takes a weight sync;
        # sao-train refuses an external engine that ties it)
        served = export_model(base.model.name, args.out / "engine_model", base.model.engine_dtype) if pending else None
        for i in range(min(args.engines, len(pending))):
            servers.append(VLLMServer(VLLMServerConfig(
                model=str(served), served_model_name=base.engine.served_name or base.model.name,
                max_model_len=base.engine.max_model_len, kv_cache_gib=base.engine.kv_cache_gib,
                dtype=base.model.engine_dtype, extra_args=tuple(base.engine.extra_args),
                startup_timeout_s=base.engine.startup_timeout_s, gpu_memory_utilization=args.gpu_memory_utilization,
                log_path=args.out / f"vllm-{i}.log")).start())

        def worker(url: str) -> None:
            while True:
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    run_job(job, url, deadline, console)
                except Exception:  # a failed run is a result, not the end of the benchmark
                    log.exception("%s failed", job.run_dir)
                    job.status = "failed"

        if not servers:  # everything is reused: no engine needed
            worker_urls: list[str] = ["http://unused"]
        else:
            worker_urls = [s.root_url for s in servers]
        threads = [threading.Thread(target=worker, args=(url,), name=f"engine-{i}") for i, url in enumerate(worker_urls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for server in servers:
            server.stop()
    if not args.keep_checkpoints:  # 3+ GB a run; the logs are what the benchmark reads
        for job in jobs:
            if job.status == "finished":
                for sub in ("checkpoints", "weights"):
                    shutil.rmtree(job.run_dir / sub, ignore_errors=True)


# ---------------------------------------------------------------------------- reading the runs


@dataclass
class RunData:
    job: Job
    evals: dict[int, dict[str, bool]]
    batch: int
    pretrain: int
    train_s: dict[int, float]
    rss_gb: float
    sync_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def read_run(job: Job) -> RunData | None:
    config_path = job.run_dir / "config.json"
    if not config_path.is_file():
        return None
    config = json.loads(config_path.read_text())
    metrics = read_jsonl(job.run_dir / "metrics.jsonl")
    pretrain = read_jsonl(job.run_dir / "value_pretrain.jsonl")
    rss = [float(r["perf/rss_gb"]) for r in metrics if isinstance(r.get("perf/rss_gb"), (int, float))]
    sync = [float(r["perf/sync_s"]) for r in metrics if r.get("step", 0) >= 1 and isinstance(r.get("perf/sync_s"), (int, float))]
    return RunData(job, load_results(job.run_dir / "eval.jsonl"), int(config["batch_size"]),
                   int(config["value_pretrain_steps"]), train_seconds(metrics, pretrain),
                   max(rss) if rss else math.nan, sum(sync) / len(sync) if sync else math.nan)


def gain_points(runs: Sequence[RunData]) -> list[tuple[float, float]]:
    """(mean training seconds, mean improvement over seeds) at each step every seed evaluated."""
    points = curve([r.evals for r in runs])
    if not points:
        return []
    first = points[0]
    out = []
    for p in points:
        secs = [r.train_s.get(p.step, math.nan) for r in runs]
        out.append((sum(secs) / len(secs), p.mean - first.mean))
    return out


# ---------------------------------------------------------------------------- reporting


def fmt(i: Interval) -> str:
    if math.isnan(i.low):
        return f"{i.value:+.3f}"
    return f"{i.value:+.3f} [{i.low:+.3f}, {i.high:+.3f}]"


def draw_heldout(by_arm: dict[str, list[RunData]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (label, runs) in enumerate(by_arm.items()):
        color = f"C{i}"
        for r in runs:
            steps = sorted(r.evals)
            ax.plot([trajectories_seen(s, r.batch, r.pretrain) for s in steps],
                    [sum(r.evals[s].values()) / len(r.evals[s]) for s in steps], color=color, alpha=0.3, lw=0.8)
        points = curve([r.evals for r in runs])
        if not points:
            continue
        xs = [trajectories_seen(p.step, runs[0].batch, runs[0].pretrain) for p in points]
        ax.plot(xs, [p.mean for p in points], "o-", color=color, label=f"{label} (seeds={len(runs)})")
        ax.fill_between(xs, [p.pooled.low for p in points], [p.pooled.high for p in points], color=color, alpha=0.15)
    ax.set_xlabel("trajectories seen (critic-only batches included)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title("held-out accuracy: mean over seeds; band = pooled 95% Wilson; thin = each seed", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def report(jobs: list[Job], args: argparse.Namespace, wall: float, console: Console) -> dict[str, Any]:
    by_arm: dict[str, list[RunData]] = {}
    status: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        status.setdefault(job.arm.label, []).append({"seed": job.seed, "dir": str(job.run_dir), "status": job.status,
                                                     "wall_s": job.wall_s})
        data = read_run(job)
        if data is not None and data.evals:
            by_arm.setdefault(job.arm.label, []).append(data)

    table = Table(title=f"held-out improvement (last - first accuracy), budget {args.budget} trajectories")
    for col, justify in (("algo", "left"), ("seeds", "right"), ("first acc", "right"), ("last acc", "right"),
                         ("Δ mean [95% t over seeds]", "right"), ("Δ pooled paired [95%]", "right"),
                         ("Δ per seed", "right"), ("collapsed", "right"), ("wall per run", "right"), ("peak RSS", "right"),
                         ("sync", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    summary: dict[str, Any] = {}
    for label, runs in by_arm.items():
        points = curve([r.evals for r in runs])
        imp = improvement_stats([r.evals for r in runs])
        walls = [r.job.wall_s for r in runs]
        seeds = ",".join(f"{r.job.seed}{'' if r.job.status == 'finished' else '*'}" for r in runs)
        fell = [r.job.seed for r in runs if collapsed(r.evals)]
        table.add_row(label, seeds, f"{points[0].mean:.3f}" if points else "-", f"{points[-1].mean:.3f}" if points else "-",
                      fmt(imp.over_seeds) if imp else "-", fmt(imp.pooled) if imp else "-",
                      " ".join(f"{d:+.3f}" for d in imp.per_seed) if imp else "-", f"{len(fell)} of {len(runs)}",
                      f"{sum(walls) / len(walls) / 60:.1f} min", f"{max(r.rss_gb for r in runs):.2f} GB",
                      f"{sum(r.sync_s for r in runs) / len(runs):.2f} s")
        summary[label] = {
            "runs": [{"seed": r.job.seed, "dir": str(r.job.run_dir), "status": r.job.status, "wall_s": r.job.wall_s,
                      "peak_rss_gb": r.rss_gb, "sync_s_mean": r.sync_s,
                      "evals": [{"step": s, "trajectories": trajectories_seen(s, r.batch, r.pretrain),
                                 "accuracy": sum(r.evals[s].values()) / len(r.evals[s]), "n": len(r.evals[s]),
                                 "train_s": r.train_s.get(s)} for s in sorted(r.evals)]} for r in runs],
            "curve": [{"step": p.step, "trajectories": trajectories_seen(p.step, runs[0].batch, runs[0].pretrain),
                       "mean": p.mean, "per_seed": list(p.per_seed), "pooled_wilson": interval_json(p.pooled),
                       "n": p.n} for p in points],
            "improvement": None if imp is None else {
                "per_seed": list(imp.per_seed), "t_over_seeds": interval_json(imp.over_seeds),
                "pooled_paired": interval_json(imp.pooled)},
            "collapsed_seeds": fell,
        }
    console.print(table)
    console.print(f"collapsed: a later held-out evaluation more than {COLLAPSE_DROP * 100:.0f} points below the run's first")
    differences = report_differences(by_arm, console)
    if any(j.status != "finished" for j in jobs):
        console.print("[yellow]* unfinished run: its last evaluation so far is used[/yellow]")

    lora = None
    if "sao+lora" in by_arm and "sao" in by_arm:
        full_imp = improvement_stats([r.evals for r in by_arm["sao"]])
        target = full_imp.over_seeds.value if full_imp else math.nan
        lora = {"target_improvement": target}
        t2 = Table(title=f"LoRA (rank 8, lr {args.lora_lr:g}) vs full fine-tuning (SAO): time to the full run's "
                         f"final improvement {target:+.3f} (training time, evaluations excluded)")
        for col in ("arm", "seeds", "time to target", "final Δ [95% t]", "peak RSS", "mean sync"):
            t2.add_column(col, justify="left" if col == "arm" else "right")
        for label in ("sao", "sao+lora"):
            runs = by_arm[label]
            reached = time_to_reach(gain_points(runs), target)
            imp = improvement_stats([r.evals for r in runs])
            rss = max(r.rss_gb for r in runs)
            sync = sum(r.sync_s for r in runs) / len(runs)
            if not target > 0:
                when = "no gain to reach"
            else:
                when = f"{reached:.0f} s" if reached is not None else "not reached"
            t2.add_row(label, str(len(runs)), when, fmt(imp.over_seeds) if imp else "-", f"{rss:.2f} GB", f"{sync:.2f} s")
            lora[label] = {"time_to_target_s": reached, "peak_rss_gb": rss, "sync_s_mean": sync,
                           "gain_points": [{"train_s": t, "gain": g} for t, g in gain_points(runs)]}
        console.print(t2)

    draw_heldout(by_arm, args.out / "heldout.png")
    try:
        from sao.rl.training.report import draw

        dirs = [r.job.run_dir for label, runs in by_arm.items() if label != "sao+lora" for r in runs]
        if dirs:
            draw(dirs, args.out / "curves.png", x="samples", label="algo", smooth_window=3)
    except Exception as exc:  # the training panels are a bonus; the held-out figures are the result
        log.warning("curves.png not drawn: %s", exc)
    base = compose_base(args.set)
    out = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "defaults": {"batch_size": base.batch_size, "lr": base.optim.lr, "env": base.env.kwargs,
                        "engine_dtype": base.model.engine_dtype, "eval_problems": args.eval_problems or base.eval.problems},
           "intervals": {"curve": "pooled Wilson over seeds x problems",
                         "improvement": "t over seeds (headline); pooled paired differences (beside it)"},
           "wall_s": wall, "status": status, "algos": summary, "differences": differences, "lora": lora}
    (args.out / "summary.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def report_differences(by_arm: dict[str, list[RunData]], console: Console) -> dict[str, Any]:
    """The first arm's improvement minus each other arm's, paired by seed (:func:`learning_stats.arm_difference`)."""
    labels = [label for label in by_arm if label != "sao+lora"]
    if len(labels) < 2:
        return {}
    table = Table(title=f"paired difference of improvements, {labels[0]} - other (same seed, same problems)")
    for col in ("pair", "seeds", "per seed", "mean [95% t over seeds]", "pooled per problem [95%]"):
        table.add_column(col, justify="left" if col == "pair" else "right")
    out: dict[str, Any] = {}
    first = {r.job.seed: r.evals for r in by_arm[labels[0]]}
    for other in labels[1:]:
        d = arm_difference(first, {r.job.seed: r.evals for r in by_arm[other]})
        name = f"{labels[0]} - {other}"
        if d is None:
            table.add_row(name, "0", "-", "-", "-")
            continue
        table.add_row(name, ",".join(map(str, d.seeds)), " ".join(f"{x:+.3f}" for x in d.per_seed),
                      fmt(d.over_seeds), fmt(d.pooled))
        out[name] = {"seeds": list(d.seeds), "per_seed": list(d.per_seed),
                     "t_over_seeds": interval_json(d.over_seeds), "pooled_per_problem": interval_json(d.pooled)}
    console.print(table)
    return out


def estimate_s(arms: list[Arm], seeds: list[int], lora_seeds: list[int], args: argparse.Namespace) -> float:
    """From the measured per-step and per-evaluation times (constants above); 2 cores, one engine."""
    total = ENGINE_START_S
    for arm in arms:
        cfg = compose_base(args.set, [f"algo={arm.algo}", *arm.overrides])
        problems = args.eval_problems or cfg.eval.problems
        batches = args.budget // cfg.batch_size
        evals = len({0, *range(0, batches + 1, eval_every(batches, args.eval_points)), batches})
        per_run = RUN_OVERHEAD_S + batches * STEP_S * cfg.batch_size / 8 + evals * EVAL_S_PER_PROBLEM * problems
        total += per_run * len(lora_seeds if arm.label == "sao+lora" else seeds)
    return total / max(1, args.engines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="sao,grpo_dis")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--budget", type=int, default=432,
                        help="trajectories per run, critic batches included (432: 3x the main job's 16 x 8 + 2 x 8)")
    parser.add_argument("--group", type=int, default=4, help="GRPO samples per prompt (0: the algo's default)")
    parser.add_argument("--pretrain", type=int, default=None,
                        help="SAO critic-only batches (inside the budget); default: the composed value_pretrain_steps")
    parser.add_argument("--eval-points", type=int, default=5, help="held-out evaluations per run, first and last included")
    parser.add_argument("--eval-problems", type=int, default=None, help="default: the composed eval.problems")
    parser.add_argument("--lora", action="store_true", help="add sao+lora (model.lora.rank=8)")
    parser.add_argument("--lora-seeds", default="1")
    parser.add_argument("--skip-equal", action="store_true",
                        help="add sao-skip-equal: SAO with algo.step_on_equal_rewards=false (no policy step on a batch "
                             "whose rewards are all equal; the critic still trains on it), on --seeds")
    parser.add_argument("--lora-lr", type=float, default=2e-4)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override applied to every run and the engine (e.g. for a GPU: device=cuda)")
    parser.add_argument("--engines", type=int, default=1, help="managed vLLMs, runs in parallel (GPU)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None, help="per engine, CUDA only")
    parser.add_argument("--deadline-s", type=float, default=None, help="stop training after this wall time, then report")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: report the runs already in --out as they are (their configurations are "
                             "not compared with today's defaults; the wall time is the sum of the runs')")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep finished runs' checkpoints/ and weights/")
    parser.add_argument("--out", type=Path, default=Path("runs/learning_arithmetic"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    seeds = [int(s) for s in args.seeds.split(",")]
    lora_seeds = [int(s) for s in args.lora_seeds.split(",")]
    arms = [Arm(a, a) for a in args.algos.split(",")]
    if args.lora:
        arms.append(Arm("sao+lora", "sao", ("model.lora.rank=8", f"optim.lr={args.lora_lr}")))
    if args.skip_equal:
        arms.append(Arm("sao-skip-equal", "sao", ("algo.step_on_equal_rewards=false",)))
    # every configuration is built (and every existing folder checked) before the engine starts
    jobs = [Job(arm, seed, args.out / f"{arm.slug}-seed{seed}", build_config(arm, seed, args, "http://unset"))
            for seed in sorted(set(seeds) | set(lora_seeds)) for arm in arms
            if seed in (lora_seeds if arm.label == "sao+lora" else seeds)]
    console = Console(width=None if sys.stdout.isatty() else 200)
    if args.report_only:
        for job in jobs:
            bench = job.run_dir / "bench.json"
            job.wall_s = read_bench(bench)["wall_s"]
            job.status = "finished" if last_step(job.run_dir) >= job.cfg.max_steps else "unfinished"
        wall = sum(job.wall_s for job in jobs)
        report(jobs, args, wall, console)
        console.print(f"report only: {len(jobs)} runs, {wall / 60:.1f} min of training in all; "
                      f"{args.out / 'heldout.png'}, {args.out / 'summary.json'}")
        return 0 if all(j.status == "finished" for j in jobs) else 1
    for job in jobs:
        check_folder(job.run_dir, job.cfg)
    args.out.mkdir(parents=True, exist_ok=True)
    console.print(f"{len(jobs)} runs, estimated {estimate_s(arms, seeds, lora_seeds, args) / 60:.0f} min "
                  f"(2-core figures; reused runs take none)")
    t0 = time.monotonic()
    run_all(jobs, args, console)
    wall = time.monotonic() - t0
    report(jobs, args, wall, console)
    console.print(f"wall {wall / 60:.1f} min; {args.out / 'heldout.png'}, {args.out / 'summary.json'}")
    return 0 if all(j.status == "finished" for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
