"""Data parallelism for the learner over ``torch.distributed`` ranks (gloo on CPU, NCCL on GPU).

Every rank holds the same models and optimizers and is handed the *whole* batch (the trajectories
are small next to the weights, so the driver broadcasts them); each rank trains on its share of the
rows, and the gradients are summed over the ranks before every optimizer step. Because every loss
the learner takes is (a sum of per-token terms) / (a batch-level normalizer) (sao.rl.objectives.losses), and the
normalizer is computed on the whole batch before sharding, the summed gradient *is* the single-process
gradient of the whole batch, so clipping and the optimizer step give the same parameters on every rank
and the same parameters as one process would (up to float summation order). Values a step returns
(the critic's predictions, which SAO's advantages need for every row) are gathered back into the
whole batch's row order; the step's metrics are summed over ranks before they are averaged.

Rows go to ranks interleaved (rank r takes rows r, r + N, ...), so on a length-sorted batch every
rank gets a similar mix of short and long rows. A rank whose share is empty (a batch, or one of
RolloutPipe's parts, with fewer rows than ranks) contributes zero gradients.

This is the seam a model too large for one device plugs into as well: FSDP2 (``fully_shard``,
:mod:`sao.rl.learner.sharding`) keeps this contract (whole-batch normalizer, per-rank rows, summed gradients)
and replaces only :meth:`DataParallel.sum_grads`, which FSDP's reduce-scatter does itself: build
``DataParallel(reduce_grads=False)`` for such models, or every gradient is summed twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from sao.rl.learner.batch import Batch


class DataParallel:
    """This process's rank of a data-parallel learner (the process group must be initialized)."""

    def __init__(self, group: dist.ProcessGroup | None = None, *, reduce_grads: bool = True) -> None:
        """``reduce_grads=False``: the models' wrapper sums the gradients over the ranks itself (FSDP2's
        reduce-scatter, :attr:`sao.rl.learner.sharding.ModelSharding.reduces_grads`); :meth:`sum_grads` is then
        a no-op."""
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DataParallel needs an initialized torch.distributed process group "
                               "(torch.distributed.init_process_group)")
        self.group, self.reduce_grads = group, reduce_grads
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)

    def share(self, n: int) -> Tensor:
        """The row indices of an ``n``-row batch that this rank trains on (empty when n <= rank)."""
        return torch.arange(self.rank, n, self.world_size)

    def shard(self, batch: Batch) -> Batch:
        """This rank's rows of ``batch`` (at the batch's full width)."""
        return batch.select(self.share(batch.size))

    def sum_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` (those that train) over the ranks, in place, in one
        all-reduce of a flat buffer per dtype. A parameter without a gradient on this rank counts 0.
        Nothing to do when the wrapper reduced them already (``reduce_grads=False``)."""
        if not self.reduce_grads:
            return
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype: dict[torch.dtype, list[Tensor]] = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def sum_floats(self, values: Mapping[str, float]) -> dict[str, float]:
        """``values`` summed over the ranks, key by key; a key missing on a rank (one with no rows)
        counts 0 there."""
        gathered: list[list[str] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, sorted(values), group=self.group)
        keys = sorted({k for g in gathered for k in (g or [])})
        t = torch.tensor([float(values.get(k, 0.0)) for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return dict(zip(keys, t.tolist()))

    def gather_rows(self, local: Tensor, n: int) -> Tensor:
        """The whole batch's ``[n, ...]`` tensor from every rank's rows (``local``: this rank's
        :meth:`share` of them, in that order)."""
        per_rank = -(-n // self.world_size)
        padded = local.new_zeros((per_rank, *local.shape[1:]))
        padded[:local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        out = local.new_empty((n, *local.shape[1:]))
        for r, part in enumerate(parts):
            idx = torch.arange(r, n, self.world_size)
            out[idx] = part[:len(idx)]
        return out
