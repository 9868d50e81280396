"""Whether bf16 autocast pays on a device: the choice behind ``optim.critic_bf16=auto``.

On a CPU, bf16 matrix products are fast only with AMX tiles (Intel Sapphire Rapids and later);
with AVX512-BF16 alone oneDNN's bf16 path ran *slower* than fp32 here (benchmarks/learner_speed.py,
2026-12-01, a 2-core Xeon with avx512_bf16 and no AMX: a bare forward+backward+AdamW step 10.0 s
under bf16 autocast against 6.7 s in fp32; SAO's update 19.4 s with a bf16 critic, 13.7 s with
an fp32 one), while on the AMX machine of the turn-1 measurement bf16 ran 2.2x faster than fp32.
On CUDA, bf16 pays where the GPU supports it (Ampere and later).
"""

from __future__ import annotations

import torch


def bf16_is_fast(device: torch.device | str) -> bool:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool(amx and amx())
    return False


def resolve_bf16(setting: object, device: torch.device | str) -> bool | None:
    """``auto`` -> :func:`bf16_is_fast`; ``true``/``false``/``null`` as given."""
    if setting == "auto":
        return bf16_is_fast(device)
    if setting is None or isinstance(setting, bool):
        return setting
    raise ValueError(f"expected auto, true, false or null, got {setting!r}")
