"""The MLflow tracker (``logger=[mlflow]``, the ``mlflow`` extra): one MLflow run per ``sao-train``.

Its store is ``logger.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a SQLite file inside
the run (``sqlite:///RUN_DIR/mlflow.db``; MLflow 3 keeps its file store in maintenance mode and refuses
it by default). The config becomes the run's params (flattened: ``optim.lr``), every step's scalars its
metrics at their policy step. A resumed ``sao-train`` starts a new MLflow run of the same name.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao.agents import Trajectory
from sao.rl.config import MlflowConfig
from sao.rl.training.trackers.tracker import flatten


def tracking_uri(cfg: MlflowConfig, run_dir: Path) -> str:
    """The store the run logs to (module doc)."""
    return cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve()}/mlflow.db"


def _key(name: str) -> str:
    return re.sub(r"[^\w./\- :]", "_", name)  # the characters MLflow accepts in a metric or param name


class MlflowTracker:
    def __init__(self, cfg: MlflowConfig, run_dir: Path, *, name: str):
        from mlflow import MlflowClient

        self.uri = tracking_uri(cfg, run_dir)
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(cfg.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:  # a local store keeps its artifacts beside it, inside the run
            local = self.uri.startswith("sqlite:///") and not cfg.tracking_uri and "MLFLOW_TRACKING_URI" not in os.environ
            location = (Path(run_dir).resolve() / "mlartifacts").as_uri() if local else None
            experiment_id = self.client.create_experiment(cfg.experiment, artifact_location=location)
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        self._closed = False

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = [Param(_key(k), str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in flatten(config).items()]
        for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS_TAGS_PER_BATCH])

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        now = int(time.time() * 1000)
        metrics = [Metric(_key(k), v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])

    def log_samples(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        pass  # the scalars say how the evaluation went; W&B keeps the table of episodes

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.set_terminated(self.run_id)
