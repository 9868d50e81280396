"""A run with a warm start (``warm_start=demonstrations``): two training runs, one after the other.

    phase 1, RUN_DIR/warm_start/:  algo=sft on the demonstrator's episodes, its stop rule (warm_start.*), the
                                   run's env, model, engine, held-out problems, seed and loggers
                                   -> curve.json (the held-out curve and the learnable band), best_model/
                                   -> handover.json, written last: phase 1 is finished
    phase 2, RUN_DIR/:             the run as configured (algo=sao, ...), from model.name=RUN_DIR/warm_start/best_model
    at the end: the warm start's curve and band, and the run's held-out first -> last with its paired interval

A resumed run (``resume=true``) whose ``handover.json`` exists goes straight to phase 2 (which resumes from
its own checkpoint): a crash in phase 2 never redoes the warm start. Without the hand-over, phase 1 resumes
from its checkpoint. Each phase is :func:`sao.rl.training.build.run_training`, unchanged; both configurations
are checked before anything slow starts. ``sao-train`` runs both phases on one engine where each would start
its own (:mod:`sao.rl.training.phase_engine`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sao.rl.config import SFTConfig, TrainConfig, WarmStartConfig, resolve_defaults, validate
from sao.rl.errors import TrainError
from sao.rl.training.early_stop import BAND, BEST_MODEL, CURVE
from sao.rl.training.heldout import improvement
from sao.rl.training.run_folder import RunFiles, refuse_to_overwrite

log = logging.getLogger(__name__)

WARM_START = "warm_start"  # phase 1's folder inside the run folder
HANDOVER = "handover.json"

Train = Callable[[TrainConfig, Path], dict[str, Any]]  # run_training's shape
# phase_engine's shape: (cfg, run_dir) -> a context giving cfg on the engine both phases use
EngineStarter = Callable[[TrainConfig, Path], contextlib.AbstractContextManager[TrainConfig]]


@dataclass(frozen=True)
class Handover:
    """What phase 1 hands to phase 2 (``RUN_DIR/warm_start/handover.json``): the best model and its
    evaluation, and whether it lies in the learnable band."""

    best_model: str
    best_step: int
    best_accuracy: float
    in_band: bool
    steps: int  # SFT steps run

    @classmethod
    def read(cls, path: Path) -> Handover | None:
        return cls(**json.loads(path.read_text())) if path.exists() else None


def warm_start_config(cfg: TrainConfig, ws: WarmStartConfig, folder: Path) -> TrainConfig:
    """Phase 1's configuration: ``cfg``'s env, model, engine, eval problems, seed and loggers; SFT with
    ``ws``'s budget, learning rate and stop rule, on one engine (``rollout=sync``)."""
    cfg = copy.deepcopy(cfg)
    return replace(cfg, algo=SFTConfig(demonstrator=ws.demonstrator, min_reward=ws.min_reward),
                   max_steps=ws.max_steps, batch_size=ws.batch_size, value_pretrain_steps=0,
                   checkpoint_every=ws.eval_every, optim=replace(cfg.optim, lr=ws.lr),
                   eval=replace(cfg.eval, enabled=True, every=ws.eval_every, patience=ws.patience,
                                                stop_above=ws.stop_above),
                   rollout=replace(cfg.rollout, mode="sync", replicas=1), output_dir=str(folder), warm_start=None)


def rl_config(cfg: TrainConfig, best_model: Path) -> TrainConfig:
    """Phase 2's configuration: ``cfg`` from the warm-started model (its ``warm_start`` block kept, so that
    the run's config.json says where the model came from)."""
    cfg = copy.deepcopy(cfg)
    return replace(cfg, model=replace(cfg.model, name=str(best_model)))


def check(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its defaults resolved and its cross-field checks passed (:class:`ConfigError` otherwise)."""
    validate(resolve_defaults(cfg))
    return cfg


def run_phases(cfg: TrainConfig, run_dir: Path, train: Train, engine: EngineStarter | None = None) -> dict[str, Any]:
    """The run in ``run_dir``, after its warm start when ``cfg.warm_start`` is set (module doc); the last
    step's metrics. ``engine``: how both phases get one engine (``sao-train``:
    :func:`sao.rl.training.phase_engine.phase_engine`); None: each phase starts its own."""
    if cfg.warm_start is None:
        return train(cfg, run_dir)
    run_dir, folder = Path(run_dir), Path(run_dir) / WARM_START
    check(warm_start_config(cfg, cfg.warm_start, folder))
    check(rl_config(cfg, folder / BEST_MODEL))  # before the warm start: its error would come after it
    if not cfg.resume:
        refuse_to_overwrite(run_dir)
    if engine is None:
        return _both_phases(cfg, run_dir, train)
    with engine(cfg, run_dir) as served:
        return _both_phases(served, run_dir, train)


def _both_phases(cfg: TrainConfig, run_dir: Path, train: Train) -> dict[str, Any]:
    assert cfg.warm_start is not None
    folder = run_dir / WARM_START
    first = warm_start_config(cfg, cfg.warm_start, folder)
    handover = Handover.read(folder / HANDOVER) if cfg.resume else None
    if handover is None:
        log.info("phase 1 of 2: the warm start from demonstrations in %s", folder)
        train(first, folder)
        handover = hand_over(folder)
    else:
        log.info("the warm start in %s finished before (%s): phase 1 is not run again", folder, HANDOVER)
    log.info("phase 2 of 2: %s from %s", cfg.algo.name, handover.best_model)
    last = train(rl_config(cfg, Path(handover.best_model)), run_dir)
    for line in summary(run_dir):
        log.info("%s", line)
    return last


def hand_over(folder: Path) -> Handover:
    """Phase 1's result from its ``curve.json``, written to ``handover.json`` (last: phase 1 is finished)."""
    curve_path, best = folder / CURVE, folder / BEST_MODEL
    if not curve_path.exists() or not best.exists():
        raise TrainError(f"the warm start in {folder} left no {CURVE} or {BEST_MODEL}/ (was eval.enabled off?)")
    curve = json.loads(curve_path.read_text())
    handover = Handover(str(best.resolve()), int(curve["best_step"]), float(curve["best_accuracy"]),
                        bool(curve["in_band"]), int(curve["curve"][-1]["step"]))
    tmp = folder / f".{HANDOVER}.tmp"
    tmp.write_text(json.dumps(asdict(handover), indent=2) + "\n")
    tmp.replace(folder / HANDOVER)
    if not handover.in_band:
        log.warning("the warm start's best held-out accuracy %.3f lies outside the learnable band %.0f%%-%.0f%%: "
                    "RL may get little signal from it", handover.best_accuracy, 100 * BAND[0], 100 * BAND[1])
    return handover


def summary(run_dir: Path) -> list[str]:
    """The closing lines: the warm start's curve and band, and the run's held-out first -> last."""
    lines = []
    curve_path = Path(run_dir) / WARM_START / CURVE
    if curve_path.exists():
        c = json.loads(curve_path.read_text())
        points = ", ".join(f"{p['step']}: {p['accuracy']:.3f} [{p['low']:.3f}, {p['high']:.3f}]" for p in c["curve"])
        band = "inside" if c["in_band"] else "outside"
        lines.append(f"warm start: held-out curve (step: accuracy [95% interval]) {points}")
        lines.append(f"warm start: best {c['best_accuracy']:.3f} at step {c['best_step']}, {band} the learnable band "
                     f"{BAND[0]:.0%}-{BAND[1]:.0%}")
    found = improvement(RunFiles(Path(run_dir)).eval)
    if found is not None:
        first, last, before, after, delta = found
        lines.append(f"RL from the warm start: held-out accuracy {before.value:.3f} -> {after.value:.3f}, {delta} "
                     f"(paired, 95% interval; step {first} -> {last})")
    return lines
