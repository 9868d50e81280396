"""The policy's learning-rate schedule: constant, or a linear or cosine decay over the run.

``factor(step)`` is the multiplier of the base lr for the policy step after ``step`` steps (0: the
first). A decay goes from 1 at the first step to ``min_ratio`` at step ``steps - 1`` (the run's last)
and holds there. Torch-free, so that configs can check a schedule before anything is loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LR_DECAYS = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class LrSchedule:
    decay: str = "constant"
    steps: int | None = None  # the run's policy steps (max_steps); needed by a decay
    min_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.decay not in LR_DECAYS:
            raise ValueError(f"unknown lr decay {self.decay!r} (known: {', '.join(LR_DECAYS)})")
        if self.decay != "constant" and not (self.steps and self.steps >= 1):
            raise ValueError(f"lr decay {self.decay!r} needs the run's steps (>= 1), got {self.steps}")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ValueError(f"the lr's min ratio must be in [0, 1], got {self.min_ratio}")

    def factor(self, step: int) -> float:
        if self.decay == "constant":
            return 1.0
        t = min(step / max(self.steps - 1, 1), 1.0)
        shape = 1.0 - t if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
        return self.min_ratio + (1.0 - self.min_ratio) * shape
