"""The run folder (``RUN_DIR``): its files, starting or resuming a run in it, and the records a run
writes there as it goes (every episode to ``trajectories.jsonl``, each step's lineage to ``batches.jsonl``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sao.agents.store import TrajectoryWriter
from sao.rl.errors import TrainError
from sao.rl.rollout import rollout_meta
from sao.rl.training.checkpoint import Checkpointer, TrainState
from sao.rl.training.metrics_log import rewind_jsonl

log = logging.getLogger(__name__)


@dataclass
class RunFiles:
    root: Path

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def pretrain(self) -> Path:
        return self.root / "value_pretrain.jsonl"

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories.jsonl"

    @property
    def batches(self) -> Path:
        return self.root / "batches.jsonl"

    @property
    def eval(self) -> Path:
        return self.root / "eval.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def weights(self) -> Path:
        return self.root / "weights"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def engine_model(self) -> Path:
        """The untied copy of the run's initial model its engine starts from (written once)."""
        return self.root / "engine_model"


def refuse_to_overwrite(run_dir: Path) -> None:
    """:class:`TrainError` when ``run_dir`` already holds a run (a non-empty ``metrics.jsonl``)."""
    metrics = RunFiles(Path(run_dir)).metrics
    if metrics.exists() and metrics.stat().st_size > 0:
        raise TrainError(f"{run_dir} already holds a run (metrics.jsonl); pass resume=true to continue it, "
                         "or choose another output_dir")


def start_or_resume(files: RunFiles, checkpointer: Checkpointer, *, resume: bool, learner: Any, source: Any,
                    algo: Any, state: TrainState) -> TrainState:
    """Load the latest checkpoint into the learner, the source and the algorithm (``resume``), or check
    that the folder is free; rewind the logs to the checkpoint. Returns the state the run goes on from
    (``state`` when it starts afresh)."""
    files.root.mkdir(parents=True, exist_ok=True)
    folder = checkpointer.latest() if resume else None
    if folder is not None:
        state = checkpointer.load(folder, learner)
        source.load_state_dict(state.source)
        algo.load_state_dict(state.algo)
        log.info("resuming from %s (step %d, %d critic pretraining steps done)", folder, state.step,
                 state.pretrain_steps)
    elif not resume:
        refuse_to_overwrite(files.root)
    else:
        log.warning("resume=true but %s has no checkpoint; starting from step 0", files.checkpoints)
    # Whatever was logged after the checkpoint is redone: drop it so no step appears twice.
    step = state.step if folder is not None else -1
    rewind_jsonl(files.metrics, step, "step")
    rewind_jsonl(files.trajectories, step, "train_step")
    rewind_jsonl(files.batches, step, "step")
    rewind_jsonl(files.eval, step, "step")
    rewind_jsonl(files.pretrain, state.pretrain_steps if folder is not None else -1, "pretrain_step")
    return state


class RunRecords:
    """What a run writes as it goes: every episode as it ends (``trajectories.jsonl``, stamped with
    ``train_step``: the step being sampled for, 0 for pretraining) and each step's lineage
    (``batches.jsonl``). Open while :meth:`sao.rl.training.trainer.Trainer.run` runs."""

    def __init__(self) -> None:
        self.train_step = 0  # the step the trajectories being sampled will feed (0: pretraining)
        self._writer: TrajectoryWriter | None = None
        self._lineage: Any = None

    def open(self, files: RunFiles, *, save_trajectories: bool) -> None:
        self._writer = TrajectoryWriter(files.trajectories) if save_trajectories else None
        self._lineage = files.batches.open("a", encoding="utf-8")

    def record(self, trajectory: Any) -> None:
        if self._writer is not None:
            meta = replace(rollout_meta(trajectory), train_step=self.train_step)
            self._writer.write(replace(trajectory, rollout=meta))

    def lineage(self, step: int, trajectories: Any) -> None:
        if self._lineage is None:
            return
        episodes = [{"task_id": t.task_id, "sample": t.sample, "prompt_index": (m := rollout_meta(t)).prompt_index,
                     "attempt": m.attempt, "policy_version": m.policy_version, "replica": m.replica}
                    for t in trajectories]
        self._lineage.write(json.dumps({"step": step, "episodes": episodes}, separators=(",", ":")) + "\n")
        self._lineage.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._lineage.close()
