"""The TensorBoard tracker: scalars as event files in ``RUN_DIR/tensorboard/`` (``logger=[tensorboard]``).

The config goes in twice: as hyperparameters (TensorBoard's HParams tab, each key flattened to
``optim.lr``, with the run's name as ``run_name``) and as one text summary ``config`` (the JSON of
``config.json``). On resume, the steps after the checkpoint are purged from the event files (they run again).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao.agents import Trajectory
from sao.rl.training.trackers.tracker import flatten


class TensorBoardTracker:
    def __init__(self, log_dir: Path, *, name: str, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.name = name
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
        self._closed = False

    def log_config(self, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        # written into this run's own event file (SummaryWriter.add_hparams would open a sub-run beside it)
        for summary in hparams({"run_name": self.name, **flatten(config)}, {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", global_step=0)
        self.writer.flush()

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_samples(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        pass  # the scalars say how the evaluation went; W&B keeps the table of episodes

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.writer.close()
