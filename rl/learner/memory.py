"""The learner process's memory: glibc's allocator set up for a long training run, and RSS
readings for the metrics.

Why (measured on the default run, 2 cores, issue 13): the policy update ran in
``asyncio.to_thread`` workers, a different pool thread from one step to the next. glibc gives each
thread that allocates under contention its own malloc arena, and memory freed into an arena is
rarely returned to the system, so every step's activations (hundreds of MB of tensors just below
glibc's dynamic mmap threshold) were left behind in a new arena: RSS went from 10.5 GB at the
first policy step to 17.4 GB at the third, and the run was OOM-killed. Three fixes, all in code:

- :func:`configure_allocator` caps the arenas (``M_ARENA_MAX``, as ``MALLOC_ARENA_MAX=2`` would)
  and sets the trim threshold; it runs at the start of every entry point, so no variable has to be
  set in the shell. It sets the mmap threshold too, because glibc stops adjusting that one as soon
  as the trim threshold is set: called before torch is imported, as the entry points do, it froze
  the threshold at glibc's initial 128 KiB, so every activation tensor was a fresh ``mmap`` that
  page-faults its zeroed pages in and is unmapped when freed. Measured in the default run (2 cores,
  3 SAO updates of 845-1,184 tokens): 17.9 / 22.7 / 24.8 s per update with 40% of the CPU time in
  the kernel (425,000 page faults a second), against 10.7 / 13.3 / 14.9 s with a 1 MiB threshold,
  11.4 / 14.1 / 15.6 s with 512 KiB (:data:`MMAP_THRESHOLD`) and 10.7 / 12.8 / 14.2 s with glibc's
  untouched defaults; peak RSS after those 3 steps 5.80 GB (1 MiB), 5.54 GB (512 KiB), 6.17 GB
  (defaults), against the issue 13 budget of 6 GB. 512 KiB buys 0.25 GB of headroom for about 5%
  of update time: with 1 MiB a 16-step run reached 6.2 GB. Tensors of 512 KiB and more (the MLP's
  intermediates, the LM head's logits, gradients, weights) still come from ``mmap`` and go back when
  freed; the many smaller ones are reused from the heap;
- :class:`sao.rl.learner.torch_thread.TorchThread` runs every torch call of the trainer on one dedicated
  thread (one arena, one OpenMP thread team), instead of whichever pool thread is free;
- :func:`release` returns freed heap to the system after each step (``malloc_trim``).

And one outside glibc: oneDNN (the CPU kernels behind bf16 matmuls, as in the value model's
autocast passes) caches a compiled primitive per input shape, up to 1,024 of them by default. The
learner's micro-batches take a new (rows, length) shape almost every step, so the cache grew by
about 27 MB per step: measured with the learner alone (SAO, batch 8, random lengths), the RSS
after each step rose 3.60 -> 3.84 GB over 10 steps, while the same run on one fixed batch shape
stayed at 3.62-3.69 GB, and with the cache off it stayed at 3.59-3.69 GB. :func:`configure_allocator`
caps the cache at :data:`ONEDNN_CACHE_CAPACITY` primitives (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``,
read by oneDNN when it first builds a primitive), unless the variable is already set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

ARENA_MAX = 2
TRIM_THRESHOLD = 64 << 20  # free heap above this at the top of an arena goes back to the system
MMAP_THRESHOLD = 512 << 10  # allocations from this size on are mmapped (and unmapped when freed)
ONEDNN_CACHE_CAPACITY = 64  # compiled oneDNN primitives kept (oneDNN's default: 1024; module doc)


@functools.cache
def _libc() -> Any | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018 - glibc only (musl has no mallopt)
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


@functools.cache
def configure_allocator() -> bool:
    """Set glibc's arena cap, trim and mmap thresholds for this process, and cap oneDNN's primitive cache
    (module doc). Idempotent; False where the C library is not glibc (the oneDNN cap still applies)."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE_CAPACITY))
    libc = _libc()
    if libc is None:
        return False
    ok = all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, ARENA_MAX), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_MMAP_THRESHOLD, MMAP_THRESHOLD)))
    if not ok:
        log.warning("glibc refused a mallopt setting; the learner's memory may grow across steps")
    return ok


def release() -> None:
    """Give freed heap memory back to the system (``malloc_trim(0)``); a no-op without glibc."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def rss_gb(pid: int | str = "self") -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in GB (10^9 bytes), from ``/proc/PID/status``; NaN
    where there is no procfs."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan"), float("nan")
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024 / 1e9
    return fields.get("VmRSS", float("nan")), fields.get("VmHWM", float("nan"))
