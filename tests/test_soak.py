"""The 2-minute version of ``benchmarks/soak.py`` (the full soak is not in CI): one managed vLLM serving
math-with-python and swe-local ``sao-eval`` runs at once for a minute, both stopped by SIGTERM, with
their processes, open files and containers sampled; then no process of the tree and no sandbox
container may be left, and every record on disk must be whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.procs import no_compile_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.vllm
@pytest.mark.docker
@pytest.mark.long
@pytest.mark.timeout(900)
def test_soak_two_minutes_leaves_nothing_behind(tmp_path: Path, smollm2_dir: Path, docker_client) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "soak"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "2", "--concurrency", "8",
         "--swe-concurrency", "2", "--swe-max-steps", "4", "--math-max-tokens", "256", "--train-steps", "0",
         "--interval", "5", "--math-env", "arithmetic", "--out", str(out)],
        capture_output=True, text=True, timeout=840, check=False,
        env=no_compile_env())  # a 2-minute engine: no torch.compile
    assert (out / "soak.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "soak.json").read_text())
    assert "error" not in result["episodes"], result["episodes"]
    leaks = result["leaked_after_episodes"]
    assert leaks == {"processes": [], "containers": []}, leaks
    for name in ("math", "swe"):
        run = result["episodes"][name]
        assert run["exit"] in (0, 143), (name, run)  # finished, or stopped by SIGTERM as a user stops it
        assert run["torn"] == 0 and run["episodes"] == run["ok"] + run["failed"], (name, run)
    assert result["episodes"]["math"]["episodes"] > 0, result["episodes"]["math"]
    # the sampler saw the engine and both evaluations, and at least one sandbox container at work
    assert {"engine", "eval-math", "eval-swe"} <= set(result["roles"]), result["roles"]
    assert result["max_containers"] >= 1
    assert proc.returncode == 0, proc.stdout[-3000:]
