"""Soak: long runs of the real parts, watched for growth and leaks. Not in CI (tests/test_soak.py runs
a 2-minute version).

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--concurrency 64] [--swe-concurrency 4]
        [--train-steps 50] [--interval 15] [--out runs/soak] [--train-set KEY=VALUE ...]

Phase 1, episodes (``--minutes``; 0 skips it). One managed vLLM (``VLLMServer``, the bundled model)
serves two ``sao-eval`` processes at once through ``--base-url``: ``beyond-aime --tools python``
(math with the python tool, ``--math-env``; its data from ``../shared/data`` when present, else the hub;
``arithmetic`` needs none; ``--concurrency`` minus the SWE share in flight) and ``swe-local --agent
llm`` (``--swe-concurrency`` in flight, each episode in its own Docker sandbox). Each is given more
episodes than the phase can finish, and is stopped with SIGTERM at the deadline, as a user stops a
run: it must exit 143 with its finished episodes on disk, and leave nothing behind.

Phase 2, training (``--train-steps``; 0 skips it): the default ``sao-train`` (its own managed engine)
for that many steps; its ``metrics.jsonl`` gives the trainer's RSS after each step, the log-prob gap
and the DIS mask.

Throughout, every ``--interval`` seconds: RSS, open files and threads of every process under this one
(grouped by role: engine, eval-math, eval-swe, tool, trainer, other), and the sandbox containers
(label ``io.sao.sandbox``). Printed as they come, kept in ``OUT/samples.jsonl``.

What it reports (and ``OUT/soak.json``):
- growth per process: mean RSS over the last fifth of its life against the mean over its second fifth
  (after warm-up); the largest per role. Target: <= 10%;
- open files and threads: the same comparison;
- the trainer: peak RSS, RSS after step 5 against after the last step, the largest gap and mask;
- leaks: processes of this tree still alive after each phase ended, and sandbox containers left.
  Target: 0. The exit status is 1 when anything leaked or a phase failed, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self

import psutil
from rich.console import Console
from rich.table import Table

from sao.sandboxes.docker import LABEL_KEY

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
console = Console()


@dataclass(frozen=True)
class ProcSample:
    """One process at one moment."""

    t: float
    pid: int
    role: str
    rss_mb: float
    fds: int
    threads: int


def role_of(cmdline: list[str]) -> str:
    """What a direct child of the soak is, from its command line."""
    text = " ".join(cmdline)
    if "vllm" in text.lower():
        return "engine"
    if "sao-eval" in text:
        return "eval-swe" if "swe-local" in text else "eval-math"
    if "sao-train" in text:
        return "trainer"
    return "other"


def role_in_tree(p: psutil.Process, roots: dict[int, str]) -> str:
    """A process's role: its own for a direct child of the soak; under one, the child's role with what it
    is there: an engine's parts are the engine; an evaluation's children its tools and sandboxes
    (``eval-math/tools``); a trainer's engine ``trainer/engine``."""
    me = os.getpid()
    chain = [p]
    try:
        while chain[-1].ppid() not in (me, 0, 1):
            chain.append(chain[-1].parent() or chain[-1])
            if len(chain) > 32 or chain[-1] is chain[-2]:
                break
    except psutil.Error:
        pass
    top = chain[-1]
    group = roots.get(top.pid) or role_of(top.cmdline())
    roots[top.pid] = group
    if top.pid == p.pid or group == "engine":
        return group
    if group == "trainer":
        return "trainer/engine" if any("vllm" in " ".join(c.cmdline()).lower() for c in chain[:-1]) else "trainer/child"
    return f"{group}/tools"


def descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def containers() -> list[str]:
    """Ids of the sandbox containers on the Docker daemon ([] without a daemon)."""
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL_KEY}"], capture_output=True, text=True, check=False)
    return out.stdout.split() if out.returncode == 0 else []


class Sampler:
    """Samples this process's descendants and the sandbox containers every ``interval`` seconds on a thread."""

    def __init__(self, out: Path, interval: float, t0: float):
        self.samples: list[ProcSample] = []
        self.seen: dict[int, float] = {}  # pid -> create time: a process that left the tree is still found
        self.container_counts: list[tuple[float, int]] = []
        self.out, self.interval, self.t0 = out, interval, t0
        self.lock = threading.Lock()  # held while sampling: its own `docker ps` is not a leak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._roots: dict[int, str] = {}  # direct child pid -> its role

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        with self.out.open("a", encoding="utf-8") as fh:
            while not self._stop.wait(self.interval):
                with self.lock:
                    self._sample(fh)

    def _sample(self, fh: Any) -> None:
        now = round(time.monotonic() - self.t0, 1)
        batch = []
        for p in descendants():
            try:
                with p.oneshot():
                    self.seen.setdefault(p.pid, p.create_time())
                    batch.append(ProcSample(now, p.pid, role_in_tree(p, self._roots), p.memory_info().rss / 2**20,
                                            p.num_fds(), p.num_threads()))
            except psutil.Error:
                continue  # ended between the listing and the read
        n_containers = len(containers())
        self.samples += batch
        self.container_counts.append((now, n_containers))
        for s in batch:
            fh.write(json.dumps(asdict(s)) + "\n")
        fh.write(json.dumps({"t": now, "containers": n_containers}) + "\n")
        fh.flush()
        self._print(now, batch, n_containers)

    def _print(self, now: float, batch: list[ProcSample], n_containers: int) -> None:
        by_role: dict[str, list[ProcSample]] = defaultdict(list)
        for s in batch:
            by_role[s.role].append(s)
        parts = [f"{r} {len(v)}p {sum(s.rss_mb for s in v) / 1024:.2f}G fd {sum(s.fds for s in v)} thr "
                 f"{sum(s.threads for s in v)}" for r, v in sorted(by_role.items())]
        console.print(f"[dim]t={now:7.0f}s[/] " + " | ".join(parts) + f" | containers {n_containers}")


def growth(values: list[float]) -> float | None:
    """Mean of the last fifth over the mean of the second fifth, minus 1 (None under 10 samples)."""
    n = len(values)
    if n < 10:
        return None
    warm = values[n // 5: 2 * n // 5]
    last = values[4 * n // 5:]
    base = sum(warm) / len(warm)
    return (sum(last) / len(last)) / base - 1 if base > 0 else None


def per_role_growth(samples: list[ProcSample]) -> dict[str, dict[str, Any]]:
    by_pid: dict[int, list[ProcSample]] = defaultdict(list)
    for s in samples:
        by_pid[s.pid].append(s)
    roles: dict[str, dict[str, Any]] = {}
    for pid, rows in by_pid.items():
        role = rows[0].role
        r = roles.setdefault(role, {"processes": 0, "peak_rss_gb": 0.0, "rss_growth": None, "fd_growth": None,
                                    "thread_growth": None, "worst_pid": None})
        r["processes"] += 1
        r["peak_rss_gb"] = max(r["peak_rss_gb"], max(s.rss_mb for s in rows) / 1024)
        for key, vals in (("rss_growth", [s.rss_mb for s in rows]), ("fd_growth", [float(s.fds) for s in rows]),
                          ("thread_growth", [float(s.threads) for s in rows])):
            g = growth(vals)
            if g is not None and (r[key] is None or g > r[key]):
                r[key] = g
                if key == "rss_growth":
                    r["worst_pid"] = pid
    return roles


def leaked_processes(seen: dict[int, float]) -> list[str]:
    """Processes started under this one that are still alive: descendants now, and any seen in a sample
    (same pid and start time) that left the tree, as an orphaned engine would. Zombies do not count."""
    candidates = {p.pid: p for p in descendants()}
    for pid, created in list(seen.items()):  # the sampler thread adds to it
        if pid not in candidates:
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:
                    candidates[pid] = p
            except psutil.Error:
                continue
    alive = []
    for p in candidates.values():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:  # exited, holds nothing; its parent has yet to reap it
                continue
            alive.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except (psutil.Error, psutil.TimeoutExpired):
            continue
    return alive


def episodes_phase(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from sao.agents.engine.server import VLLMServer, VLLMServerConfig
    from sao.agents.models.prepare import resolve_model

    model = resolve_model("smollm2-135m")
    config = VLLMServerConfig(model=model, served_model_name="smollm2-135m", log_path=out / "vllm.log",
                              startup_timeout_s=600.0)  # a loaded 2-core machine has taken over 300 s
    report: dict[str, Any] = {}
    with VLLMServer(config) as server:  # started here, stopped (whole process group) at the end
        # the bundled model's sizes pinned (the benchmarks' own budgets: no token limit, SWE 50 turns)
        common = ["--base-url", server.base_url, "--model", "smollm2-135m", "--tokenizer", model,
                  "--endpoint-mode", "tokens", "--seed", "0", "--max-turns", "50"]
        math_c = max(1, args.concurrency - args.swe_concurrency)
        runs = {
            "math": [str(BIN / "sao-eval"), args.math_env, *(["--data", str(args.math_data)] if args.math_data else []),
                     "--tools", "python", "--samples", "64",
                     "--concurrency", str(math_c), "--max-tokens", str(args.math_max_tokens), "--output", str(out / "math"), *common],
            "swe": [str(BIN / "sao-eval"), "swe-local", "--agent", "llm", "--samples", "64",
                    "--concurrency", str(args.swe_concurrency), "--max-steps", str(args.swe_max_steps),
                    "--max-tokens", "1024", "--output", str(out / "swe"), *common],
        }
        if args.swe_concurrency == 0:
            del runs["swe"]
        procs = {name: subprocess.Popen(cmd, stdout=(out / f"{name}.log").open("w"), stderr=subprocess.STDOUT)
                 for name, cmd in runs.items()}
        deadline = time.monotonic() + args.minutes * 60
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            time.sleep(1)
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            try:
                rc = p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            path = out / name / "trajectories.jsonl"
            records, torn = [], 0
            text = path.read_text(encoding="utf-8") if path.exists() else ""
            for line in filter(str.strip, text.split("\n")):  # "\n" only: old records' text may hold a raw U+2028
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    torn += 1  # a record cut by the stop: data lost
            report[name] = {"exit": rc, "episodes": len(records), "torn": torn,
                            "ok": sum(r.get("status") == "ok" for r in records),
                            "failed": sum(r.get("status") == "failed" for r in records),
                            "tail": (out / f"{name}.log").read_text()[-400:]}
    return report


def training_phase(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    run_dir = out / "train"
    cmd = [str(BIN / "sao-train"), f"max_steps={args.train_steps}", f"output_dir={run_dir}", *args.train_set]
    with (out / "train.log").open("w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()] \
        if (run_dir / "metrics.jsonl").exists() else []
    steps = [r for r in rows if "perf/rss_now_gb" in r]
    rss = {int(r["step"]): r["perf/rss_now_gb"] for r in steps if "step" in r}
    last = max(rss) if rss else None
    gaps = [r["rollout/logprob_gap"] for r in rows if r.get("rollout/logprob_gap") is not None]
    return {
        "exit": rc,
        "steps": len(steps),
        "peak_rss_gb": max((r["perf/rss_gb"] for r in steps), default=None),
        "rss_after_step_5_gb": rss.get(5),
        "rss_after_last_gb": rss.get(last) if last else None,
        "growth_5_to_last": (rss[last] / rss[5] - 1) if last and 5 in rss else None,
        "max_logprob_gap": max(gaps, default=None),
        "mean_logprob_gap": sum(gaps) / len(gaps) if gaps else None,
        "max_mask_frac": max((r["dis/mask_frac"] for r in rows if r.get("dis/mask_frac") is not None), default=None),
        "eval": [r["eval/accuracy"] for r in rows if r.get("eval/accuracy") is not None],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=64, help="episodes in flight in all")
    p.add_argument("--swe-concurrency", type=int, default=4, help="of them, swe-local episodes (0: math only)")
    p.add_argument("--math-env", default="beyond-aime", help="the math benchmark (arithmetic needs no data)")
    p.add_argument("--math-data", type=Path, default=None,
                   help="its local copy (default for beyond-aime: ../shared/data/beyond_aime.jsonl when present)")
    p.add_argument("--swe-max-steps", type=int, default=50, help="tool steps of a swe-local episode")
    p.add_argument("--math-max-tokens", type=int, default=1024, help="generated tokens of a math episode")
    p.add_argument("--train-steps", type=int, default=50)
    p.add_argument("--train-set", action="append", default=[], help="extra sao-train override")
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "soak")
    args = p.parse_args(argv)
    shared = ROOT.parent / "shared" / "data" / "beyond_aime.jsonl"
    if args.math_data is None and args.math_env == "beyond-aime" and shared.exists():
        args.math_data = shared
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "samples.jsonl").unlink(missing_ok=True)
    for name in ("math", "swe", "train"):  # a soak starts from nothing: earlier runs' folders go
        shutil.rmtree(args.out / name, ignore_errors=True)
    t0 = time.monotonic()
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    before = set(containers())  # sandbox containers of someone else's runs are not this soak's leaks
    phases = ([("episodes", episodes_phase)] if args.minutes > 0 else []) + \
        ([("training", training_phase)] if args.train_steps > 0 else [])
    with Sampler(args.out / "samples.jsonl", args.interval, t0) as sampler:
        for name, phase in phases:
            try:
                result[name] = phase(args, args.out)
            except Exception as exc:  # noqa: BLE001 - the figures so far are still written and reported
                result[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            time.sleep(2)
            with sampler.lock:
                result[f"leaked_after_{name}"] = {"processes": leaked_processes(sampler.seen),
                                                  "containers": sorted(set(containers()) - before)}
    result["roles"] = per_role_growth(sampler.samples)
    result["max_containers"] = max((n for _, n in sampler.container_counts), default=0)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    (args.out / "soak.json").write_text(json.dumps(result, indent=2))
    return report(result)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def report(result: dict[str, Any]) -> int:
    table = Table(title=f"soak: {result['wall_s'] / 60:.1f} min; growth = last fifth of a process's life "
                        "against its second fifth (target <= +10%)")
    for col in ("role", "processes", "peak RSS GB", "RSS growth", "open files growth", "threads growth"):
        table.add_column(col)
    for role, r in sorted(result["roles"].items()):
        table.add_row(role, str(r["processes"]), f"{r['peak_rss_gb']:.2f}", _pct(r["rss_growth"]),
                      _pct(r["fd_growth"]), _pct(r["thread_growth"]))
    console.print(table)
    failed = False
    for phase in ("episodes", "training"):
        if "error" in result.get(phase, {}):
            console.print(f"[red]{phase} failed: {result[phase]['error']}[/]")
            failed = True
    episodes = result.get("episodes", {})
    for name, e in ({} if "error" in episodes else episodes).items():
        console.print(f"{name}: exit {e['exit']}, {e['episodes']} episodes ({e['ok']} ok, {e['failed']} failed), "
                      f"{e['torn']} torn records")
        # a SWE episode can outlast a short soak (the 2-minute CI version); a long one must finish some
        idle = e["episodes"] == 0 and (name == "math" or float(result["args"]["minutes"]) >= 5)
        failed |= e["exit"] not in (0, 143) or idle or e["torn"] > 0
    if "training" in result and "error" not in result["training"]:
        t = result["training"]
        console.print(f"training: exit {t['exit']}, {t['steps']} steps, peak RSS {t['peak_rss_gb']} GB, RSS after "
                      f"step 5 {t['rss_after_step_5_gb']} -> last {t['rss_after_last_gb']} GB "
                      f"({_pct(t['growth_5_to_last'])}; target <= +10%), max gap {t['max_logprob_gap']}, mean gap "
                      f"{t['mean_logprob_gap']}, max mask {t['max_mask_frac']}, eval {t['eval']}")
        failed |= t["exit"] != 0
    leaks = 0
    for key in ("leaked_after_episodes", "leaked_after_training"):
        if key in result:
            n = len(result[key]["processes"]) + len(result[key]["containers"])
            leaks += n
            console.print(f"{key}: {len(result[key]['processes'])} processes, {len(result[key]['containers'])} "
                          f"containers" + (f": {result[key]}" if n else ""))
    console.print(f"max sandbox containers at once: {result['max_containers']}; leaks: {leaks} (target 0)")
    return 1 if failed or leaks else 0


if __name__ == "__main__":
    sys.exit(main())
