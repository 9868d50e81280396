"""``sao-eval`` survives its local vLLM being SIGKILLed mid-run (issue 14), against the real vLLM.

The contract: ``sao-eval arithmetic --limit 16 --samples 2 --output DIR`` whose engine is killed once
some episodes are done exits 0 with 32 ok episodes, each (task, sample) once, without ``--resume``,
and leaves no vLLM process behind. The kill is a SIGKILL of vLLM's API server only, as in the issue:
harder than killing its process group, because the group's EngineCore outlives the API server and
must be ended by the run (it lived on for 2 minutes before). The run keeps 8 episodes in flight
(``--concurrency 8``): at the default 32 every episode can start in one batch and end within one poll
of the others, and then nothing is left to be in flight at the kill (CI saw all 32 done at once). One real start and one restart: about
3-5 minutes on 2 cores. It is also the suite's test of ``sao-eval`` starting its own engine (no
``--base-url``): the outputs are checked as for every finished run. The watch's logic is tested fast in ``tests/test_engine_watch.py``.
(Moved here from ``tests/test_eval_engine_restart.py``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.faults.procs import API_SERVER, SAO_EVAL, count_lines, no_compile_env, running, vllm_processes
from tests.test_engine import require_vllm
from tests.test_vllm_integration import _check_outputs as check_outputs


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.part("sao-eval")
def test_sao_eval_restarts_a_killed_vllm_and_finishes_every_episode_once(tmp_path: Path) -> None:
    require_vllm()
    out = tmp_path / "run"
    log = (tmp_path / "stderr.log").open("wb")
    # the bundled model's sizes, pinned (the benchmark's budgets have no token limit and a managed engine
    # takes the model's own 8,192-token context)
    proc = subprocess.Popen([SAO_EVAL, "arithmetic", "--limit", "16", "--samples", "2", "--concurrency", "8",
                             "--max-tokens", "1024", "--max-turns", "50", "--max-model-len", "4096",
                             "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=log, env=no_compile_env())
    seen: dict[int, object] = {}  # every vLLM process of this run, to check at the end that none is left
    killed: dict[int, object] = {}  # the first engine's processes, at its death
    t0, deadline = time.monotonic(), time.monotonic() + 1500
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "sao-eval did not finish in 25 minutes"
            seen |= vllm_processes(proc.pid)
            done = count_lines(out / "trajectories.jsonl")
            if not killed and done >= 4:
                assert done < 32, "every episode ended before the kill; nothing was in flight"
                killed = dict(seen)
                server = next(pid for pid, p in killed.items() if API_SERVER in " ".join(p.cmdline()))  # type: ignore[attr-defined]
                os.kill(server, signal.SIGKILL)  # the API server only: its EngineCore is left to the run
                killed_at = time.monotonic()
            if killed and any(running(p) for p in killed.values()):
                assert time.monotonic() - killed_at < 60, "the dead engine's EngineCore outlived it by a minute"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    stderr = (tmp_path / "stderr.log").read_text(errors="replace")
    assert proc.returncode == 0, stderr[-4000:]
    assert killed, f"the engine was never seen under sao-eval; stderr:\n{stderr[-4000:]}"
    assert "restarting the engine (restart 1 of at most 3)" in stderr

    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    pairs = [(r["task_id"], r["sample"]) for r in records]
    assert len(records) == 32 and len(set(pairs)) == 32, "a pair was lost or recorded twice"
    assert all(r["status"] == "ok" for r in records)  # the attempts the death cut are not results
    summary = check_outputs(out, 16, 2)  # what any finished sao-eval run writes (tests/test_vllm_integration.py)
    assert set(summary["pass@k"]) == {"1", "2"} and (out / "vllm.log").stat().st_size > 0
    assert summary["n_episodes"] == 32 and summary["n_failed"] == 0 and summary["infra_errors"] == 0
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 16 and len({r["task_id"] for r in results}) == 16
    assert all(len(r["correct"]) == 2 for r in results)

    time.sleep(1.0)
    left = [pid for pid, p in seen.items() if running(p)]
    for pid in left:  # ours: do not leak them into the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"vLLM processes of the run outlived it: {left}"
    assert len(seen) > len(killed), "no second engine was seen"
    print(f"sao-eval with a killed engine: {time.monotonic() - t0:.0f} s")  # noqa: T201
