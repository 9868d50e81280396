"""The Weights & Biases tracker (``logger=[wandb]``, the ``wandb`` extra): one W&B run per ``sao-train``.

The config is the run's W&B config, every step's scalars are logged at their policy step, and each
held-out evaluation adds a table ``eval/samples`` of its first ``logger.wandb.samples`` episodes
(task, status, correct, reward, prompt, response). ``WANDB_MODE=offline`` needs no account: the run's
files stay under ``RUN_DIR/wandb/`` until ``wandb sync`` uploads them. A resumed ``sao-train`` starts a
new W&B run of the same name (W&B refuses steps below those it has, and the steps after the checkpoint
run again).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao.agents import Trajectory
from sao.rl.config import WandbConfig
from sao.rl.errors import TrainError
from sao.rl.training.trackers.tracker import SAMPLE_COLUMNS, sample_row


class WandbTracker:
    def __init__(self, cfg: WandbConfig, run_dir: Path, *, name: str):
        import wandb

        self._wandb, self.samples = wandb, cfg.samples
        folder = cfg.dir or os.environ.get("WANDB_DIR") or str(run_dir)
        Path(folder).mkdir(parents=True, exist_ok=True)
        try:
            # console="off": W&B would otherwise wrap this process's stdout and stderr to copy them
            self.run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group, tags=list(cfg.tags) or None,
                                  name=name, dir=folder, mode=cfg.mode, reinit="create_new",
                                  settings=wandb.Settings(console="off"))
        except Exception as exc:  # no account online, a bad mode: at the start, not mid-run
            raise TrainError(f"logger=[wandb]: wandb.init failed ({type(exc).__name__}: {exc}); log in with "
                             "`wandb login`, or run offline with WANDB_MODE=offline") from exc
        self._closed = False

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_samples(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        if self.samples <= 0 or not trajectories:
            return
        table = self._wandb.Table(columns=SAMPLE_COLUMNS,
                                  data=[sample_row(step, t) for t in list(trajectories)[:self.samples]])
        self.run.log({"eval/samples": table}, step=step)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.run.finish()
