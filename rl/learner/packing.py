"""Sequence packing: a right-padded micro-batch runs through the transformer as ONE padding-free
sequence, and its hidden states come back in the batch's [B, T] layout.

Why (issue 13, measured on 2 cores): a padded micro-batch of ``b`` rows costs ``b x longest``
token positions, and its shape ``(b, longest)`` is new almost every step. The second matters more
than it seems: oneDNN (the CPU's bf16 matmuls, as in the value model's autocast passes) compiles a
kernel per input shape, 1.5 ms each, and caches a bounded number of them, so varying shapes meant a
compilation on most calls and a cache that grew by ~27 MB a step. Packed, the real tokens of the
micro-batch are laid end to end, each row restarting its ``position_ids`` at 0, and the sequence is
padded up to a multiple of :data:`QUANTUM` tokens: no padding inside rows, and a handful of shapes
in a whole run.

Exactness: the rows must not see each other. Hugging Face's mask builder (``masking_utils``, every
current decoder: Llama, Qwen, Mistral, ...) reads a restart of ``position_ids`` as a sequence
boundary when no ``attention_mask`` is given, and builds the block-diagonal causal mask itself (for
the sdpa and eager kernels alike); ``use_cache=False`` is required for that. The padding at the end
is one more such segment, whose outputs are dropped. :func:`packing_is_exact` checks it on a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

QUANTUM = 64  # a packed sequence's length is a multiple of this: few distinct shapes per run


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a right-padded ``[B, T]`` micro-batch go in one packed sequence.

    mask:         [B, T] bool, the real tokens (a prefix of each row).
    position_ids: [1, N] long, each row's positions 0..len-1 in turn, then 0..pad-1 for the tail.
    length:       N, the real token count rounded up to a multiple of ``quantum``.
    """

    mask: Tensor
    position_ids: Tensor
    length: int

    @classmethod
    def of(cls, attention_mask: Tensor, quantum: int = QUANTUM) -> Packing:
        mask = attention_mask.bool()
        lengths = mask.sum(-1)
        real = int(lengths.sum())
        length = max(-(-real // quantum) * quantum, quantum)
        device = attention_mask.device
        # per-row positions, read off the padded layout: position t of a row is t
        pos = torch.arange(mask.shape[1], device=device).expand_as(mask)[mask]
        tail = torch.arange(length - real, device=device)
        return cls(mask=mask, position_ids=torch.cat([pos, tail])[None], length=length)

    def pack(self, x: Tensor, fill: int | float = 0) -> Tensor:
        """[B, T, ...] -> [1, N, ...]: the real entries in row order, then ``fill`` up to N."""
        flat = x[self.mask]
        pad = flat.new_full((self.length - flat.shape[0], *flat.shape[1:]), fill)
        return torch.cat([flat, pad])[None]

    def unpack(self, y: Tensor) -> Tensor:
        """[1, N, ...] -> [B, T, ...]: each real entry back in its row and column, 0 at padding."""
        real = int(self.mask.sum())
        out = y.new_zeros((*self.mask.shape, *y.shape[2:]))
        out[self.mask] = y[0, :real]
        return out


def packed_hidden(backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                  quantum: int = QUANTUM) -> Tensor:
    """``backbone(input_ids, attention_mask).last_hidden_state`` ([B, T, H]) computed on the packed
    sequence (module doc); 0 at padding positions, where the padded call gives whatever the pad
    token produced (callers never read those)."""
    packing = Packing.of(attention_mask, quantum)
    out = backbone(input_ids=packing.pack(input_ids), position_ids=packing.position_ids, use_cache=False)
    return packing.unpack(out.last_hidden_state)


def trunk_hidden(trunk: nn.Module, input_ids: Tensor, attention_mask: Tensor, packed: bool) -> Tensor:
    """The trunk's last hidden state [B, T, H]: on the padded batch, or packed (:func:`packed_hidden`)."""
    if packed:
        return packed_hidden(trunk, input_ids, attention_mask)
    return trunk(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


@torch.no_grad()
def packing_is_exact(backbone: nn.Module, vocab: int, rtol: float = 1e-4) -> bool:
    """Whether ``backbone`` gives the same hidden states packed as padded, on two random rows of
    different lengths (the second row is where a missing block-diagonal mask shows), in eval mode
    (dropout off) and back to the mode it was in. Same: the largest difference is within ``rtol`` of
    the largest hidden value (float rounding; SmolLM2: 1.4e-5, and 0.6 without the block mask)."""
    training = backbone.training
    backbone.eval()
    try:
        return _same_hidden(backbone, vocab, rtol)
    finally:
        backbone.train(training)


def _same_hidden(backbone: nn.Module, vocab: int, rtol: float) -> bool:
    gen = torch.Generator().manual_seed(0)
    device = next(backbone.parameters()).device
    ids = torch.randint(1, vocab, (2, 12), generator=gen).to(device)
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    padded = backbone(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    packed = packed_hidden(backbone, ids, mask, quantum=8)
    real = mask.bool()
    err = (packed[real].float() - padded[real].float()).abs().max()
    return bool(err <= rtol * padded[real].float().abs().max().clamp(min=1.0))
