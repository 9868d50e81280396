"""Issue 36's contract: ``sao-train max_steps=2 logger=[tensorboard,wandb,mlflow]`` on a real engine exits 0 with
W&B offline (its files inside the run) and MLflow's default store inside the run (``sqlite:///RUN/mlflow.db``);
each store, read back with its own reader (tests/tracker_stores.py), holds both steps' scalars as
``metrics.jsonl`` has them, the config and the run's name; then ``sao-report RUN`` leaves ``RUN/report.png``
and prints its path."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tracker_stores as stores
from tests.faults.procs import SAO_TRAIN, jsonl
from tests.test_engine import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.long, pytest.mark.part("sao-train", "trackers")]
SAO_REPORT = str(Path(sys.executable).with_name("sao-report"))


@pytest.mark.timeout(1200)
def test_sao_train_logs_both_steps_to_tensorboard_wandb_and_mlflow_and_sao_report_draws_into_the_run(
        tmp_path: Path) -> None:
    require_vllm()
    pytest.importorskip("wandb", reason="wandb is an optional extra: pip install -e '.[wandb]'")
    pytest.importorskip("mlflow", reason="mlflow is an optional extra: pip install -e '.[mlflow]'")
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env |= {"WANDB_MODE": "offline", "WANDB_DIR": str(run)}
    args = [f"output_dir={run}", "max_steps=2", "batch_size=2", "value_pretrain_steps=0", "eval.enabled=false",
            "logger=[tensorboard,wandb,mlflow]", "checkpoint_every=100", "keep_checkpoints=1",
            "engine.kv_cache_gib=1", "engine.extra_args=[-O0]"]
    done = subprocess.run([SAO_TRAIN, *args], capture_output=True, text=True, timeout=1100, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = {r["step"]: r for r in jsonl(run / "metrics.jsonl")}
    assert sorted(rows) == [1, 2]
    # the scalars every store must hold at both steps, as metrics.jsonl has them
    keys = ["loss/policy", "loss/value", "reward/mean", "engine/weight_version", "perf/sync_s", "perf/step_s"]
    expected = {k: {s: float(rows[s][k]) for s in (1, 2)} for k in keys}
    assert all(math.isfinite(v) for series in expected.values() for v in series.values()), expected

    def check(stored: dict[str, dict[int, float]], store: str) -> None:
        for key in keys:
            assert stored.get(key) == pytest.approx(expected[key], rel=1e-6), (store, key, stored.get(key))

    check(stores.tensorboard_scalars(run / "tensorboard"), "tensorboard")
    hparams = stores.tensorboard_hparams(run / "tensorboard")
    assert (hparams["algo.name"], hparams["max_steps"], hparams["run_name"]) == ("sao", 2, "run")

    wandb_run = stores.wandb_offline_run(run / "wandb")
    check(stores.wandb_scalars(wandb_run), "wandb")
    assert wandb_run["name"] == "run"
    assert stores.wandb_config_value(wandb_run["config"], "algo.name") == "sao"
    assert stores.wandb_config_value(wandb_run["config"], "batch_size") == 2

    mlflow_run = stores.mlflow_run(f"sqlite:///{run.resolve()}/mlflow.db")
    check(mlflow_run["metrics"], "mlflow")
    assert (mlflow_run["name"], mlflow_run["status"]) == ("run", "FINISHED")
    assert (mlflow_run["params"]["algo.name"], mlflow_run["params"]["max_steps"]) == ("sao", "2")

    report = subprocess.run([SAO_REPORT, str(run)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert report.stdout.strip() == str(run / "report.png")
    assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "report.png").exists()
