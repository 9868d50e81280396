"""`sao-eval` behaviour that needs no engine: bad input fails fast with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import shared_file

EVAL = [sys.executable, "-m", "sao.evals.cli"]


def test_row_missing_answer_exits_nonzero_naming_row_and_field(tmp_path):
    rows = [json.loads(line) for line in shared_file("beyond_aime.jsonl").read_text().splitlines()[:5]]
    del rows[3]["answer"]
    bad = tmp_path / "beyond_aime_bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([*EVAL, "beyond-aime", "--data", str(bad), "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "row 4" in proc.stderr and "'answer'" in proc.stderr and "beyond_aime_bad.jsonl" in proc.stderr
    assert not (tmp_path / "out" / "trajectories.jsonl").exists()


def test_unknown_benchmark_suggests_a_name(tmp_path):
    proc = subprocess.run([*EVAL, "imo-answerbnch", "--output", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Did you mean 'imo-answerbench'" in proc.stderr


def test_existing_output_needs_resume(tmp_path):
    (tmp_path / "trajectories.jsonl").write_text("{}\n")
    proc = subprocess.run([*EVAL, "arithmetic", "--limit", "2", "--output", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--resume" in proc.stderr
