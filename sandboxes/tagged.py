"""Processes found by a tag in their environment: a variable every descendant inherits, so a process that
left its group (``setsid``, a double fork) or whose parent died is still found, in ``/proc/*/environ``.

:mod:`sao.sandboxes.local` tags each command's processes with ``SAO_RUN_ID``; :mod:`sao.rl.cluster.engine_host`
tags each engine server's with its replica folder (``SAO_ENGINE_FOLDER``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Collection


def kill_tagged(var: str, values: Collection[str], *, rounds: int = 50) -> int:
    """SIGKILL every process (of ours) whose environment holds ``var=value`` for one of ``values``,
    sweeping again until a sweep finds none (a process may fork while it is swept), at most ``rounds``
    times; return how many were killed. Without ``/proc`` (not Linux) it finds nothing."""
    needles = {f"{var}={value}".encode() for value in values}
    killed = 0
    for _ in range(rounds):
        found = False
        try:
            entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
        except OSError:
            return killed
        for pid in entries:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needles.isdisjoint(f.read().split(b"\0")):
                        continue
                os.kill(int(pid), signal.SIGKILL)
            except OSError:  # gone meanwhile, or another user's
                continue
            found = True
            killed += 1
        if not found:
            return killed
    return killed
