"""Whether bf16 autocast pays on a device: the choice behind ``optim.critic_bf16=auto``.

- CUDA: where the GPU supports bf16 (Ampere and later).
- A CPU with AMX tiles (Intel Sapphire Rapids and later): yes. On the AMX machine of the turn-1
  measurement bf16 ran 2.2x faster than fp32.
- A CPU without native bf16 arithmetic (no AVX512-BF16: AVX2-only Zen 3, older Xeons): no; oneDNN
  emulates it.
- A CPU with AVX512-BF16 but no AMX: it depends on the chip, so it is *measured*. On a 2-core Xeon
  of that kind (2026-12-01) a bare forward+backward+AdamW step ran 10.0 s under bf16 autocast
  against 6.7 s in fp32 (benchmarks/learner_speed.py); on a 2-core AMD Zen 4 (2026-12-02) a bf16
  matrix product of the model's MLP shape ran 3.5-4x faster than fp32. :func:`measured_speedup`
  times a forward+backward of an MLP block under autocast and in fp32 (best of several rounds, so
  a busy neighbour slows both alike), and the decision is cached per machine in
  ``$SAO_HOME/precision.json`` (keyed by CPU model, torch threads and torch version), so that two
  runs of one configuration on one machine train in the same precision.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MIN_SPEEDUP = 1.3  # bf16 must beat fp32 by this much: a near tie is not worth its rounding
CACHE_FILE = "precision.json"


def bf16_is_fast(device: torch.device | str, *, cache_dir: Path | None = None) -> bool:
    """Whether ``device`` runs bf16 autocast markedly faster than fp32 (module doc)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    if _cpu_has("_is_amx_tile_supported"):
        return True
    if not _cpu_has("_is_avx512_bf16_supported"):
        return False
    return cached_cpu_decision(cache_dir)


def _cpu_has(probe: str) -> bool:
    fn = getattr(torch.cpu, probe, None)
    return bool(fn and fn())


def cpu_key() -> str:
    """What the cached decision holds for: this CPU model, this process's torch threads, this torch."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} | threads={torch.get_num_threads()} | torch={torch.__version__}"


def cached_cpu_decision(cache_dir: Path | None = None) -> bool:
    """This machine's measured answer, measured once and cached (module doc)."""
    if cache_dir is None:
        from sao.agents.models.prepare import sao_home

        cache_dir = sao_home()
    path, key = Path(cache_dir) / CACHE_FILE, cpu_key()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - held across the measurement
    except OSError as exc:
        log.warning("cannot use %s (%s); measuring bf16 without caching the answer", path.parent, exc)
        return measured_speedup() >= MIN_SPEEDUP
    with lock:
        # data-parallel ranks resolve this at the same time: one measures, the others wait and read its
        # answer, so that every rank trains its critic in the same precision
        fcntl.flock(lock, fcntl.LOCK_EX)
        entry = _read(path).get(key)
        if not (isinstance(entry, dict) and isinstance(entry.get("speedup"), (int, float))):
            speedup = measured_speedup()
            entry = {"speedup": round(speedup, 3), "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
            try:
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps({**_read(path), key: entry}, indent=2) + "\n")
                tmp.replace(path)
            except OSError as exc:
                log.warning("could not cache the bf16 measurement in %s: %s", path, exc)
            log.info("bf16 autocast on this CPU (%s): %.2fx fp32's speed, measured once and cached in %s",
                     key, speedup, path)
    return float(entry["speedup"]) >= MIN_SPEEDUP


def _read(path: Path) -> dict:
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def measured_speedup(*, tokens: int = 256, hidden: int = 576, inner: int = 1536, rounds: int = 5) -> float:
    """fp32 time / bf16-autocast time of a forward+backward through a SwiGLU MLP block of the bundled
    model's shape (``tokens`` x ``hidden`` -> ``inner``), best of ``rounds`` each, interleaved."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen)
    up = torch.randn(hidden, 2 * inner, generator=gen, requires_grad=True)
    down = torch.randn(inner, hidden, generator=gen, requires_grad=True)

    def step(bf16: bool) -> float:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            gate, value = (x @ up).chunk(2, dim=-1)
            out = (torch.nn.functional.silu(gate) * value) @ down
        out.float().square().mean().backward()
        up.grad = down.grad = None
        return time.perf_counter() - started

    step(False), step(True)  # warm-up: oneDNN's first call builds its kernels
    fp32, bf16 = [], []
    for _ in range(rounds):
        fp32.append(step(False))
        bf16.append(step(True))
    return min(fp32) / min(bf16)


def resolve_bf16(setting: object, device: torch.device | str) -> bool | None:
    """``auto`` -> :func:`bf16_is_fast`; ``true``/``false``/``null`` as given."""
    if setting == "auto":
        return bf16_is_fast(device)
    if setting is None or isinstance(setting, bool):
        return setting
    raise ValueError(f"expected auto, true, false or null, got {setting!r}")
