"""The stop rule on held-out accuracy (``eval.patience``), the curve it reads, and the best model it keeps.

    after each held-out evaluation (step 0 included):
        curve += (step, accuracy, its 95% interval)
        accuracy > ceiling (eval.stop_above):  stop; it is not the best (the best stays inside the band)
        accuracy > best:  best = it; the policy is saved to RUN_DIR/best_model; waited = 0
        else, once accuracy has risen above the first evaluation:  waited += 1;  waited == patience: stop
    A curve that has not yet risen has not stopped rising: a warm start whose first evaluations stay at
    its starting accuracy (sampled, a 135M model's tool calls break for a few steps before any succeed) runs
    on, to its step budget at most. (Counting from step 0, a first rule stopped such a run after 2 steps.)
    RUN_DIR/curve.json: the curve, the best step and accuracy, and whether the best lies in the learnable
    band (20-80%: RL has signal there; issue 35)

``RUN_DIR/best_model`` is a Hugging Face folder (weights as the learner holds them, config, tokenizer and
chat template): ``model.name=RUN_DIR/best_model`` starts a later run from it, the hand-over from a warm
start (``algo=sft``) to RL. A resumed run replays the curve from ``eval.jsonl`` (rewound to its checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sao.rl.training.heldout import load_results, wilson_interval

log = logging.getLogger(__name__)

BAND = (0.2, 0.8)  # the learnable band: held-out accuracy where RL gets signal (issue 35)
BEST_MODEL = "best_model"
CURVE = "curve.json"


@dataclass(frozen=True)
class CurvePoint:
    """One held-out evaluation: its step and accuracy with a 95% interval."""

    step: int
    accuracy: float
    low: float
    high: float


class Patience:
    """Stop when accuracy, having risen above its first evaluation, has not risen above its best for
    ``patience`` evaluations in a row, or has risen above ``ceiling`` (a point above it is never the best,
    unless it is the first) (pure)."""

    def __init__(self, patience: int, ceiling: float | None = None):
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.patience, self.ceiling = patience, ceiling
        self.curve: list[CurvePoint] = []
        self.best: CurvePoint | None = None
        self.waited = 0
        self.above = False  # an evaluation rose above the ceiling

    def observe(self, point: CurvePoint) -> bool:
        """Add ``point``; whether it is a new best (strictly above the best so far, not above the ceiling)."""
        self.curve.append(point)
        if self.ceiling is not None and point.accuracy > self.ceiling:
            self.above = True
            if self.best is not None:
                return False
        if self.best is None or point.accuracy > self.best.accuracy:
            self.best, self.waited = point, 0
            return True
        if self.risen:
            self.waited += 1
        return False

    @property
    def risen(self) -> bool:
        """Whether the best lies above the first evaluation (the curve has started rising)."""
        return self.best is not None and self.best is not self.curve[0]

    @property
    def stop(self) -> bool:
        return self.waited >= self.patience or self.above

    def summary(self) -> dict[str, Any]:
        """What ``curve.json`` holds."""
        best = self.best
        return {"curve": [asdict(p) for p in self.curve], "patience": self.patience, "waited": self.waited,
                "stopped": self.stop, "above_ceiling": self.above, "ceiling": self.ceiling,
                "best_step": best.step if best else None,
                "best_accuracy": best.accuracy if best else None, "band": list(BAND),
                "in_band": bool(best and BAND[0] <= best.accuracy <= BAND[1])}


def point_of(step: int, metrics: dict[str, Any]) -> CurvePoint:
    """The curve point of an evaluation's metrics (:meth:`~sao.rl.training.heldout.EvalResult.metrics`)."""
    return CurvePoint(step, float(metrics["eval/accuracy"]), float(metrics["eval/accuracy_low"]),
                      float(metrics["eval/accuracy_high"]))


def save_hf_model(model: Any, model_dir: Path, out: Path) -> Path:
    """``model`` as a Hugging Face folder ``out`` (``save_pretrained``) with ``model_dir``'s tokenizer and chat
    template beside it; written aside and renamed into place, so ``out`` is always whole."""
    from sao.rl.weights.sync import TOKENIZER_FILES

    out = Path(out)
    tmp = out.parent / f".{out.name}-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (Path(model_dir) / name).exists():
            shutil.copy2(Path(model_dir) / name, tmp / name)
    old = out.parent / f".{out.name}-old"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


class EarlyStop:
    """The trainer's stop rule (module doc): :class:`Patience` over the held-out evaluations, the best
    policy saved to ``run_dir/best_model``, the curve to ``run_dir/curve.json``."""

    def __init__(self, patience: int, run_dir: Path, model_dir: Path, *, ceiling: float | None = None):
        self.rule = Patience(patience, ceiling)
        self.run_dir, self.model_dir = Path(run_dir), Path(model_dir)

    @property
    def best_model(self) -> Path:
        return self.run_dir / BEST_MODEL

    def replay(self, eval_path: Path) -> None:
        """Rebuild the curve from ``eval.jsonl`` (a resumed run; nothing is saved)."""
        for step, results in sorted(load_results(eval_path).items()):
            acc = wilson_interval(sum(results.values()), len(results))
            self.rule.observe(CurvePoint(step, acc.value, acc.low, acc.high))

    def observe(self, step: int, metrics: dict[str, Any], policy: Any) -> bool:
        """After an evaluation at ``step``: keep the policy if it is the best, write the curve; whether to
        stop. Touches the policy's tensors: call it on the run's torch thread."""
        if self.rule.observe(point_of(step, metrics)):
            save_hf_model(policy, self.model_dir, self.best_model)
            log.info("held-out accuracy %.3f at step %d is the best so far: saved to %s", metrics["eval/accuracy"],
                     step, self.best_model)
        (self.run_dir / CURVE).write_text(json.dumps(self.rule.summary(), indent=2) + "\n")
        return self.rule.stop

    def report(self) -> str:
        """The curve in one line, with the best and the band."""
        s = self.rule.summary()
        points = ", ".join(f"{p['step']}: {p['accuracy']:.3f}" for p in s["curve"])
        band = "inside" if s["in_band"] else "outside"
        return (f"held-out curve (step: accuracy) {points}; best {s['best_accuracy']:.3f} at step {s['best_step']}, "
                f"{band} the learnable band {BAND[0]:.0%}-{BAND[1]:.0%}; model: {self.best_model}")
