"""Parity of the project's SWE grader with swebench's official harness, on the same predictions and images.

    .venv/bin/python benchmarks/swe_parity.py [--instances ID,ID,...] [--rows FILE] [--image-map FILE]
                                              [--json FILE] [--keep DIR]

For every genuine instance built by ``tests/swe_real`` (``$SAO_SWE_REAL_DIR``, default
~/.cache/sao/swe-real: ``instances.jsonl``, ``images.json``; or ``--rows``/``--image-map``), three
predictions:

* **gold**: the ``preds.json`` that ``sao-eval swe-bench-verified --agent gold`` writes (the diff the
  gold agent made through the tools); ours is that run's own grading of it;
* **empty**: ``""``;
* **test-only**: the row's ``test_patch`` sent as the fix;

each graded by ``python -m swebench.harness.run_evaluation`` (4.1.0, unchanged, through
:mod:`sao.envs.swebench.official`) and by ``sao-eval swe-bench-verified --grade-only`` (gold: by the
gold run). Prints a table (instance, prediction, the harness's verdict, ours, how many
FAIL_TO_PASS/PASS_TO_PASS outcomes both list, agree?), the tests where those lists differ, the key comparison of our ``report.json`` with the
harness's run report, and the wall time of each run. Exits 1 on any disagreement, 2 when the inputs
are missing. The work (the harness's ``logs/``, our outputs) is in a temporary folder, removed at
the end unless ``--keep DIR`` names one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sao.envs.swebench.official import HarnessRun, run_harness

PREDICTIONS = ("gold", "empty", "test-only")
OUT_ENV = "SAO_SWE_REAL_DIR"
# our report.json's lists -> the harness's verdict words
OUR_KINDS = {"resolved_ids": "resolved", "unresolved_ids": "unresolved", "empty_patch_ids": "empty",
             "error_ids": "error"}


def swe_real_dir() -> Path:
    """Where tests/swe_real builds the genuine instances (as tests/test_swe_real.py's ``out_dir``)."""
    if os.environ.get(OUT_ENV):
        return Path(os.environ[OUT_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "sao" / "swe-real"


@dataclass(frozen=True)
class Verdict:
    """One grader's verdict on one prediction."""

    verdict: str  # resolved | unresolved | empty | error
    tests_status: dict[str, dict[str, list[str]]] | None


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    instance_id: str
    prediction: str
    harness: str
    ours: str
    agree: bool
    tests_compared: int  # FAIL_TO_PASS and PASS_TO_PASS outcomes both listed
    test_differences: list[str]  # "FAIL_TO_PASS success: only the harness: [...]" and the like


def sao_eval(args: list[str], output: Path) -> float:
    """Run ``sao-eval swe-bench-verified ARGS --output OUTPUT`` (the installed entry point); its wall time."""
    exe = Path(sys.executable).with_name("sao-eval")
    command = [str(exe) if exe.exists() else (shutil.which("sao-eval") or "sao-eval"), "swe-bench-verified",
               *args, "--output", str(output), "--concurrency", "1"]
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return time.monotonic() - started


def our_verdicts(output: Path) -> dict[str, Verdict]:
    """Our verdicts from a sao-eval output folder: ``report.json``'s lists, ``reports/ID.json``'s tests."""
    report = json.loads((output / "report.json").read_text())
    out = {}
    for key, verdict in OUR_KINDS.items():
        for instance_id in report[key]:
            per = output / "reports" / f"{instance_id}.json"
            tests = json.loads(per.read_text()).get("report", {}).get("tests_status") if per.exists() else None
            out[instance_id] = Verdict(verdict, tests)
    return out


def harness_verdicts(run: HarnessRun) -> dict[str, Verdict]:
    return {i: Verdict(v.verdict, v.tests_status) for i, v in run.verdicts.items()}


def test_differences(harness: dict[str, Any] | None, ours: dict[str, Any] | None) -> tuple[int, list[str]]:
    """``(compared, differences)``: how many test verdicts of FAIL_TO_PASS and PASS_TO_PASS both graders
    list, and each (list, outcome) whose tests differ, with the tests. One grader listing tests where
    the other lists none is a difference too."""
    if not harness and not ours:
        return 0, []
    if not harness or not ours:
        return 0, [f"only {'the harness' if harness else 'ours'} lists the tests' outcomes"]
    compared, out = 0, []
    for group in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        for outcome in ("success", "failure"):
            h = set(harness.get(group, {}).get(outcome, []))
            o = set(ours.get(group, {}).get(outcome, []))
            compared += len(h | o)
            if h != o:
                out.append(f"{group} {outcome}: only the harness: {sorted(h - o)}; only ours: {sorted(o - h)}")
    return compared, out


def write_predictions(path: Path, model: str, patches: dict[str, str]) -> Path:
    """A preds.json (keyed by instance id) of ``patches``."""
    path.write_text(json.dumps({i: {"instance_id": i, "model_name_or_path": model, "model_patch": p}
                                for i, p in patches.items()}, indent=2) + "\n")
    return path


def run_parity(rows: list[dict[str, Any]], images: dict[str, str], work: Path) -> dict[str, Any]:
    """Every prediction of every row graded by both; the table, the key comparison and the times."""
    work.mkdir(parents=True, exist_ok=True)
    rows_path = work / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    map_path = work / "images.json"
    map_path.write_text(json.dumps(images, indent=1) + "\n")
    data = ["--data", str(rows_path), "--image-map", str(map_path)]
    times: dict[str, dict[str, float]] = {}
    ours: dict[str, dict[str, Verdict]] = {}
    preds: dict[str, Path] = {}

    times["gold"] = {"ours_s": sao_eval(["--agent", "gold", *data], work / "ours-gold")}
    preds["gold"] = work / "ours-gold" / "preds.json"  # the gold run's own preds.json goes to the harness
    ours["gold"] = our_verdicts(work / "ours-gold")
    preds["empty"] = write_predictions(work / "preds-empty.json", "sao-parity-empty", {r["instance_id"]: "" for r in rows})
    preds["test-only"] = write_predictions(work / "preds-test-only.json", "sao-parity-test-only",
                                           {r["instance_id"]: r["test_patch"] for r in rows})
    for kind in ("empty", "test-only"):
        times[kind] = {"ours_s": sao_eval(["--grade-only", str(preds[kind]), *data], work / f"ours-{kind}")}
        ours[kind] = our_verdicts(work / f"ours-{kind}")

    harness: dict[str, HarnessRun] = {}
    for kind in PREDICTIONS:
        run_id = f"sao-parity-{kind}-{uuid.uuid4().hex[:8]}"
        harness[kind] = run_harness(rows_path, preds[kind], images, work / f"harness-{kind}", run_id)
        times[kind]["harness_s"] = harness[kind].duration_s

    table = []
    for row in rows:
        iid = row["instance_id"]
        for kind in PREDICTIONS:
            h = harness_verdicts(harness[kind]).get(iid, Verdict("missing", None))
            o = ours[kind].get(iid, Verdict("missing", None))
            compared, diffs = test_differences(h.tests_status, o.tests_status)
            table.append(Row(iid, kind, h.verdict, o.verdict, h.verdict == o.verdict and not diffs, compared, diffs))
    our_keys = set(json.loads((work / "ours-gold" / "report.json").read_text()))
    harness_keys = set(harness["gold"].report)
    keys = {"harness": sorted(harness_keys), "missing_from_ours": sorted(harness_keys - our_keys),
            "ours_adds": sorted(our_keys - harness_keys)}
    gold_errors = [i for i, v in harness["gold"].verdicts.items() if v.verdict == "error"]
    return {"table": [asdict(r) for r in table], "keys": keys, "times": times,
            "gold_preds_accepted": not gold_errors, "gold_preds_errors": gold_errors,
            "tags_added": sorted({t for run in harness.values() for t in run.tags_added}),
            "agree": all(r.agree for r in table) and not keys["missing_from_ours"] and not gold_errors}


def print_result(result: dict[str, Any], wall_s: float) -> None:
    print("| instance | prediction | harness | ours | tests compared | agree |")
    print("|---|---|---|---|---|---|")
    for r in result["table"]:
        print(f"| {r['instance_id']} | {r['prediction']} | {r['harness']} | {r['ours']} | {r['tests_compared']} | "
              f"{'yes' if r['agree'] else 'NO'} |")
    for r in result["table"]:
        for d in r["test_differences"]:
            print(f"tests differ, {r['instance_id']} {r['prediction']}: {d}")
    print("\n| prediction | harness run | sao-eval run |")
    print("|---|---|---|")
    for kind, t in result["times"].items():
        print(f"| {kind} | {t['harness_s']:.1f} s | {t['ours_s']:.1f} s |")
    keys = result["keys"]
    print(f"\nreport.json vs the harness's run report: missing from ours {keys['missing_from_ours'] or 'none'}; "
          f"ours adds {keys['ours_adds'] or 'nothing'}")
    print(f"the gold run's preds.json accepted by run_evaluation: "
          f"{'yes' if result['gold_preds_accepted'] else 'NO, errors on ' + ', '.join(result['gold_preds_errors'])}")
    n = len(result["table"])
    agreed = sum(r["agree"] for r in result["table"])
    print(f"agree on {agreed} of {n} predictions; wall time {wall_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", help="ids separated by commas (default: every row)")
    parser.add_argument("--rows", type=Path, help="the rows (default: SWE_REAL_DIR/instances.jsonl)")
    parser.add_argument("--image-map", type=Path, help="{instance_id: image} (default: SWE_REAL_DIR/images.json)")
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)

    rows_path = args.rows or swe_real_dir() / "instances.jsonl"
    map_path = args.image_map or swe_real_dir() / "images.json"
    missing = [str(p) for p in (rows_path, map_path) if not p.is_file()]
    if missing:
        print(f"missing {', '.join(missing)}: build the genuine instances first "
              f"(.venv/bin/python -m tests.swe_real.build {swe_real_dir()}) or pass --rows/--image-map",
              file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    images = json.loads(map_path.read_text())
    if args.instances:
        wanted = [i.strip() for i in args.instances.split(",") if i.strip()]
        unknown = sorted(set(wanted) - {r["instance_id"] for r in rows})
        if unknown:
            print(f"{rows_path} has no rows for {', '.join(unknown)}", file=sys.stderr)
            return 2
        rows = [r for r in rows if r["instance_id"] in wanted]
    images = {r["instance_id"]: images[r["instance_id"]] for r in rows}

    started = time.monotonic()
    if args.keep:
        result = run_parity(rows, images, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="sao-swe-parity-") as tmp:
            result = run_parity(rows, images, Path(tmp))
    wall_s = time.monotonic() - started
    result["wall_s"] = wall_s
    print_result(result, wall_s)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
