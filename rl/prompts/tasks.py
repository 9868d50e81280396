"""Which prompts a training run sees, in a deterministic, resumable order.

Prompt ``i`` of a run is a pure function of ``(seed, i)``: for an endless environment (arithmetic)
it is the ``i``-th task of the seed's stream; for a finite dataset it is position ``i mod n`` of the
permutation drawn for epoch ``i // n``. The only state is the cursor, so a checkpoint that stores
it resumes on exactly the prompts an uninterrupted run would have drawn next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sao.envs import make, resolve


@dataclass(frozen=True)
class PromptRef:
    """One prompt drawn for training: its position in the run's stream and the environment task."""

    index: int
    task_id: str


class TaskStream:
    """The run's prompt order over one environment (see the module doc)."""

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], seed: int):
        self.env_name = resolve(env_name).name
        self.seed = seed
        self.cursor = 0
        env = make(self.env_name, **env_kwargs)
        try:
            base = env.unwrapped
            self.endless = bool(getattr(base, "endless", False))
            self._source = base
            self._ids: list[str] = [] if self.endless else list(base.task_ids(None))
        finally:
            env.close()
        if not self.endless and not self._ids:
            raise ValueError(f"{self.env_name}: the dataset has no tasks")
        self._perm: dict[int, np.ndarray] = {}

    def _id_at(self, i: int) -> str:
        if self.endless:
            if i >= len(self._ids):  # grow geometrically: amortized O(1) per prompt
                self._ids = list(self._source.task_ids(max(2 * len(self._ids), i + 1, 64)))
            return self._ids[i]
        n = len(self._ids)
        epoch = i // n
        if epoch not in self._perm:
            self._perm = {epoch: np.random.default_rng([self.seed, epoch]).permutation(n)}
        return self._ids[int(self._perm[epoch][i % n])]

    def take(self, n: int) -> list[PromptRef]:
        """The next ``n`` prompts; advances the cursor."""
        out = [PromptRef(i, self._id_at(i)) for i in range(self.cursor, self.cursor + n)]
        self.cursor += n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"env": self.env_name, "seed": self.seed, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["env"] != self.env_name or state["seed"] != self.seed:
            raise ValueError(f"checkpoint is for env {state['env']!r} seed {state['seed']}, "
                             f"not {self.env_name!r} seed {self.seed}")
        self.cursor = int(state["cursor"])
