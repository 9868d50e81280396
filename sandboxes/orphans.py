"""Sandbox containers whose owner process is gone.

Every sandbox container carries its owner, ``io.sao.sandbox.owner=HOST:PID`` (the process that created
it). A process that exits, or is stopped by a signal it can handle, removes its own containers
(:mod:`sao.sandboxes.docker_cleanup`'s registry). One that is SIGKILLed or OOM-killed cannot: its containers
would stay, running ``sleep infinity`` with their memory limits reserved, until someone ran
``sao-sandbox gc``. So the first sandbox a process starts removes the containers of this host's dead
owners first (:func:`reap_orphans`). Containers of live processes, of other hosts sharing the daemon,
and of unreadable owners are left alone: a pid reused by a live process keeps its orphans until that
process ends too.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def owner_label() -> str:
    """This process's owner label value: ``HOST:PID``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a zombie counts; one we may not signal does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_owner(owner: str | None, host: str, alive: Callable[[int], bool] = pid_alive) -> bool:
    """Whether ``owner`` (``HOST:PID``) names a process of ``host`` that no longer exists."""
    if not owner or ":" not in owner:
        return False
    owner_host, _, pid = owner.rpartition(":")
    return owner_host == host and pid.isdigit() and int(pid) > 0 and not alive(int(pid))


def list_labelled(client: Any, selector: str) -> list[Any]:
    """The containers (running or not) whose labels match ``selector``.

    The SDK lists, then inspects each container; one removed in between (by its owner, or by another
    process's clean-up) is skipped, not an error: without ``ignore_removed`` it raises ``NotFound``
    and the caller's clean-up (or sandbox start) fails for a container that is already gone.
    """
    return client.containers.list(all=True, filters={"label": selector}, ignore_removed=True)


def reap_orphans(client: Any, *, host: str | None = None, alive: Callable[[int], bool] = pid_alive) -> list[str]:
    """Remove the sandbox containers of ``host``'s (default: this host's) dead owners; returns their names."""
    import docker.errors

    from .docker_cleanup import LABEL_KEY, OWNER_LABEL_KEY

    host = socket.gethostname() if host is None else host
    removed = []
    for container in list_labelled(client, LABEL_KEY):
        owner = (container.labels or {}).get(OWNER_LABEL_KEY)
        if not dead_owner(owner, host, alive):
            continue
        try:
            container.remove(force=True, v=True)
            removed.append(container.name)
        except docker.errors.NotFound:
            pass  # removed meanwhile
    if removed:
        log.warning("removed %d sandbox container(s) left by processes that died (SIGKILL, OOM): %s",
                    len(removed), ", ".join(removed))
    return removed


class OnceReaper:
    """:func:`reap_orphans` once per process (again in a forked child), before its first sandbox."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done_in: int | None = None  # the pid that reaped: a forked child reaps again

    def __call__(self, client: Any) -> None:
        with self._lock:
            if self._done_in == os.getpid():
                return
            self._done_in = os.getpid()
            try:
                reap_orphans(client)
            except Exception as exc:  # noqa: BLE001 - a failed sweep must not stop the sandbox it precedes
                log.warning("could not sweep for orphaned sandbox containers: %s", exc)
