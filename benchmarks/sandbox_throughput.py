"""Sandbox throughput: local SWE episodes graded per minute, and the latency of sandbox primitives.

    python benchmarks/sandbox_throughput.py [--episodes 24] [--concurrency 1 4 8] [--starts 10] [--execs 50]

Section 1 runs full ``swe-local`` episodes driven by the gold policy (agent container start with
history hiding, ``editor``/``bash`` tool calls, ``git diff``, a fresh grading container and
swebench's grading) on a thread pool, one environment per episode, cycling over the local tasks.
After one unmeasured warm-up episode, each concurrency level runs ``--episodes`` episodes and
reports episodes per minute of wall time, how many were resolved (every one must be) and the
median episode wall time, with the medians of the env's own reset and grading times beside it.

Section 2 times :class:`~sao.sandboxes.DockerSandbox` on the base image, one call at a time:
container start (constructor until it returns with a started container, and until a first
``run("true")`` answers), ``run("true")``, ``write_file``/``read_file`` of a small file, and close.

Every container carries a per-run label; ``gc(label=...)`` runs at the end, also on errors and on
SIGTERM, so nothing leaks. About two minutes on two cores. Not run in CI.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

import sao.envs as E
from sao.envs.swe_policies import gold_policy, play
from sao.envs.swebench import build_local_tasks
from sao.sandboxes import BASE_IMAGE, DockerSandbox, ensure_base_image, gc


@dataclass(frozen=True)
class Episode:
    """One graded episode: its task, whether it was resolved, and where the time went (seconds)."""

    task_id: str
    resolved: bool
    wall_s: float
    reset_s: float
    grading_s: float
    error: str | None


@dataclass(frozen=True)
class Level:
    """Episodes run at one concurrency level, and the wall time of the whole batch."""

    concurrency: int
    episodes: list[Episode]
    wall_s: float

    @property
    def per_minute(self) -> float:
        return 60.0 * len(self.episodes) / self.wall_s

    @property
    def resolved(self) -> int:
        return sum(e.resolved for e in self.episodes)


def episode(data: str, label: str, task_id: str) -> Episode:
    """One full swe-local episode with the gold policy, in its own environment."""
    started = time.perf_counter()
    env = E.make("swe-local", data=data, label=label)
    try:
        info = play(env, gold_policy(env.unwrapped.get(task_id)), task_id=task_id)
    except Exception as exc:  # noqa: BLE001 - a broken episode is a figure of the benchmark, not a crash
        return Episode(task_id, False, time.perf_counter() - started, float("nan"), float("nan"),
                       f"{type(exc).__name__}: {exc}")
    finally:
        env.close()
    timing = info.get("timing", {})
    error = info["error"] or (None if info["correct"] else f"not resolved: {info['report'].get('status')}")
    return Episode(task_id, bool(info["correct"]), time.perf_counter() - started,
                   timing.get("reset_s", float("nan")), timing.get("grading_s", float("nan")), error)


def run_level(data: str, label: str, task_ids: list[str], episodes: int, concurrency: int) -> Level:
    batch = [task_ids[i % len(task_ids)] for i in range(episodes)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(lambda t: episode(data, label, t), batch))
    return Level(concurrency, done, time.perf_counter() - started)


def timed(fn: Any, n: int) -> list[float]:
    """Wall time of ``n`` calls of ``fn`` (seconds)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def primitives(label: str, starts: int, execs: int, files: int) -> dict[str, list[float]]:
    """Latencies of the sandbox primitives on the base image, one call at a time (seconds)."""
    lat: dict[str, list[float]] = {"start": [], "start+first exec": [], "close": []}
    for _ in range(starts):
        t0 = time.perf_counter()
        sb = DockerSandbox(BASE_IMAGE, label=label, name_prefix="sao-bench-")
        lat["start"].append(time.perf_counter() - t0)
        try:
            assert sb.run("true").ok
            lat["start+first exec"].append(time.perf_counter() - t0)
        finally:
            t1 = time.perf_counter()
            sb.close()
            lat["close"].append(time.perf_counter() - t1)

    payload = bytes(range(256)) * 16  # 4 KiB
    with DockerSandbox(BASE_IMAGE, label=label, name_prefix="sao-bench-", workdir="/tmp") as sb:
        sb.run("true")  # warm-up
        lat['run("true")'] = timed(lambda: sb.run("true"), execs)
        lat["write_file 4 KiB"] = timed(lambda: sb.write_file("bench.bin", payload), files)
        assert sb.read_file("bench.bin") == payload
        lat["read_file 4 KiB"] = timed(lambda: sb.read_file("bench.bin"), files)
    return lat


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ms(x: float) -> str:
    return f"{1000 * x:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 24: a multiple of 8 (full waves at every level) and of the 6 tasks (each task equally often).
    p.add_argument("--episodes", type=int, default=24, help="episodes per concurrency level")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--starts", type=int, default=10, help="container starts to time")
    p.add_argument("--execs", type=int, default=50, help='run("true") calls to time')
    p.add_argument("--files", type=int, default=50, help="write_file and read_file calls to time (each)")
    args = p.parse_args()

    # Default SIGTERM kills Python without running `finally`; exit normally so gc runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    label = f"bench-throughput-{uuid.uuid4().hex[:8]}"
    console = Console()
    if not console.is_terminal:  # piped into a file or a note: rich would assume 80 columns and clip headers
        console = Console(width=120)
    failed = False
    try:
        ensure_base_image()
        data = str(build_local_tasks())  # build (or find cached) the tasks and images once, not per env
        probe = E.make("swe-local", data=data, label=label)
        task_ids = probe.unwrapped.task_ids()
        probe.close()
        console.print(f"label {label}; {len(task_ids)} local tasks; {os.cpu_count()} CPUs; "
                      f"load average before (1/5/15 min) {load()}; warm-up episode ...")
        warm = episode(data, label, task_ids[0])
        if not warm.resolved:
            raise SystemExit(f"warm-up episode of {warm.task_id} failed: {warm.error}")

        levels = [run_level(data, label, task_ids, args.episodes, c) for c in args.concurrency]
        table = Table(title=f"swe-local episodes with the gold policy: {args.episodes} per level, "
                            f"{len(task_ids)} tasks, one env per episode")
        for col in ("concurrency", "episodes/min", "resolved", "batch s", "episode s\n(median)",
                    "episode s\n(min-max)", "reset s\n(median)", "grading s\n(median)"):
            table.add_column(col, justify="right")
        for lv in levels:
            walls = [e.wall_s for e in lv.episodes]
            table.add_row(str(lv.concurrency), f"{lv.per_minute:.1f}", f"{lv.resolved}/{len(lv.episodes)}",
                          f"{lv.wall_s:.1f}", f"{statistics.median(walls):.2f}",
                          f"{min(walls):.2f}-{max(walls):.2f}",
                          f"{statistics.median(e.reset_s for e in lv.episodes):.2f}",
                          f"{statistics.median(e.grading_s for e in lv.episodes):.2f}")
        console.print(table)
        for lv in levels:
            print(f"swe-local gold episodes at concurrency {lv.concurrency}: {lv.per_minute:.1f} episodes/min, "
                  f"resolved {lv.resolved}/{len(lv.episodes)}, median episode "
                  f"{statistics.median(e.wall_s for e in lv.episodes):.2f} s")
            for e in lv.episodes:
                if not e.resolved:
                    failed = True
                    print(f"  FAILED {e.task_id}: {e.error}")

        lat = primitives(label, args.starts, args.execs, args.files)
        table = Table(title=f"DockerSandbox primitives on {BASE_IMAGE}, one call at a time (ms)")
        for col in ("operation", "n", "median", "min", "p90", "max"):
            table.add_column(col, justify="right")
        for name, xs in lat.items():
            q = statistics.quantiles(xs, n=10)[-1] if len(xs) > 1 else xs[0]
            table.add_row(name, str(len(xs)), ms(statistics.median(xs)), ms(min(xs)), ms(q), ms(max(xs)))
        console.print(table)
        for name, xs in lat.items():
            print(f"DockerSandbox {name} latency (median of {len(xs)}): {ms(statistics.median(xs))} ms")
    finally:
        removed = gc(label=label)
        print(f"load average after (1/5/15 min, this run included): {load()}; other work on the machine "
              f"inflates every figure")
        print(f"gc(label={label!r}) removed {removed} leftover container(s)")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
