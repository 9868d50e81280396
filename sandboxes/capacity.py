"""How many sandbox containers this machine holds at once: the default bound for concurrent
coding episodes (``sao-train`` ``env.max_concurrent``, ``sao-eval --concurrency`` on SWE tasks).

Each episode keeps one container busy (the agent's, then the grading one): the tests it runs
want a core, its memory limit wants RAM. The bound is two containers per core (an agent's
container idles while the model thinks) and one per ``memory_gb`` of the memory available now,
at least 1. On the 2-core, 24 GiB machine this project is sized for it is 4.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its affinity, which a container or ``taskset`` narrows."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def container_slots(*, memory_gb: float = 2.0, per_core: int = 2) -> int:
    """Containers this machine can run at once (module doc)."""
    return max(1, min(per_core * usable_cores(), int(_available_gb() // memory_gb)))


def _available_gb() -> float:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 2**30
