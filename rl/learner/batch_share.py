"""One process's share of a learner step: the whole batch's normalizer, this rank's rows, and the
gradients, metric sums and rows brought back from every rank.

Without data parallelism (``dp`` None) a process trains on every row and nothing is summed; with it
(:class:`~sao.rl.learner.parallel.data_parallel.DataParallel`) every rank is handed the whole batch,
takes the same whole-batch normalizer, trains on its rows, and sums what the step produced.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from sao.rl.learner.batch import Batch
from sao.rl.learner.parallel import DataParallel


class BatchShare:
    """The batch as one step of this process sees it (module doc). ``agg`` and ``agg_normalizer``: the
    loss aggregation whose normalizer :meth:`normalizer` gives (sao.rl.objectives.losses)."""

    def __init__(self, dp: DataParallel | None, device: torch.device, agg: str, agg_normalizer: float | None):
        self.dp, self.device, self.agg, self.agg_normalizer = dp, device, agg, agg_normalizer

    def normalizer(self, action_mask: Tensor) -> float:
        """The full batch's normalizer for the configured aggregation (see sao.rl.objectives.losses)."""
        return self.normalizer_of(int(action_mask.sum()), int((action_mask.sum(-1) > 0).sum()))

    def normalizer_of(self, action_tokens: int, rows: int) -> float:
        """The normalizer of a batch with ``action_tokens`` action tokens in ``rows`` non-empty rows."""
        if self.agg == "token-mean":
            return float(max(action_tokens, 1))
        if self.agg == "seq-mean-token-mean":
            return float(max(rows, 1))
        return float(self.agg_normalizer)

    def local(self, batch: Batch) -> Batch:
        """The rows this process trains on: all of them, or this rank's share."""
        return batch if self.dp is None else self.dp.shard(batch)

    def reduce(self, params: Any, sums: dict[str, float], loss: float, n_mb: int
               ) -> tuple[dict[str, float], float, int]:
        """Data-parallel: sum ``params``' gradients and the step's metric sums over the ranks."""
        if self.dp is None:
            return sums, loss, n_mb
        self.dp.sum_grads(params)
        total = self.dp.sum_floats({**{f"m:{k}": v for k, v in sums.items()}, "loss": loss, "n_mb": n_mb})
        return ({k[2:]: v for k, v in total.items() if k.startswith("m:")}, total["loss"], int(total["n_mb"]))

    def gather(self, values: list[Tensor], last: list[Tensor], batch: Batch) -> tuple[Tensor, Tensor]:
        """The whole batch's (values [B, T], last [B]) from this process's micro-batches' pieces."""
        width = batch.input_ids.shape[1]
        v = torch.cat(values) if values else torch.zeros((0, width), device=self.device)
        lv = torch.cat(last) if last else torch.zeros((0,), device=self.device)
        if self.dp is None:
            return v, lv
        return self.dp.gather_rows(v, batch.size), self.dp.gather_rows(lv, batch.size)
