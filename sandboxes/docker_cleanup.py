"""Sandbox containers are not left behind: the labels they carry, the daemon they are reached through,
and their removal (at exit, once an absent daemon answers again, and :func:`gc` after a crash).

:class:`~sao.sandboxes.docker.DockerSandbox` registers each container it starts in :data:`registry`,
which removes the live ones at interpreter exit (``atexit``; not in forked children) and remembers
the ones whose removal failed while the daemon was away. After a SIGKILL nothing runs: every
container carries ``io.sao.sandbox=<label>`` and its owner ``io.sao.sandbox.owner=HOST:PID``, so
:func:`gc` (``sao-sandbox gc``) and the orphan sweep (:mod:`.orphans`) find the leftovers.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from .errors import DockerUnavailableError
from .orphans import OnceReaper, list_labelled

if TYPE_CHECKING:
    from .docker import DockerSandbox

log = logging.getLogger(__name__)

LABEL_KEY = "io.sao.sandbox"
"""Label every sandbox container carries; its value is the ``label`` argument (default ``"1"``)."""
LABEL_VALUE = "1"
OWNER_LABEL_KEY = "io.sao.sandbox.owner"
"""``host:pid`` of the process that created the container: a dead one's are removed (:mod:`.orphans`)."""

_EXIT_WAIT_S = 30.0  # at exit, how long to wait for an absent daemon to remove the containers it still has


def connect(client: Any = None) -> Any:
    """A Docker client that answers ``ping`` (``docker.from_env()`` unless given)."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - the SDK is a dependency
        raise DockerUnavailableError("the `docker` Python package is not installed") from exc
    try:
        client = client or docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no usable daemon"
        raise DockerUnavailableError(exc) from exc
    return client


def gc(label: str | None = None, client: Any = None) -> int:
    """Remove every sandbox container (label ``io.sao.sandbox``, or ``io.sao.sandbox=label``).

    Returns how many were removed. Without ``label`` this also removes the live sandboxes of
    other processes; give each run its own label when several may run at once.
    """
    import docker.errors

    own = client is None
    client = connect(client)
    try:
        selector = LABEL_KEY if label is None else f"{LABEL_KEY}={label}"
        removed = 0
        for container in list_labelled(client, selector):
            try:
                container.remove(force=True, v=True)
                removed += 1
            except docker.errors.NotFound:
                pass  # removed meanwhile by its owner
        return removed
    finally:
        if own:
            client.close()


reap_once = OnceReaper()
"""The orphan sweep, run before this process's first sandbox (:mod:`.orphans`)."""


class Registry:
    """Live sandboxes of this process, removed at interpreter exit (not in forked children)."""

    def __init__(self) -> None:
        self._live: dict[int, DockerSandbox] = {}
        self._unremoved: dict[str, str] = {}  # container id or name -> name: closed while the daemon was away
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._hooked = False

    def unremoved(self, container_id: str, name: str) -> None:
        with self._lock:
            self._unremoved[container_id] = name

    def remove_unremoved(self, client: Any) -> None:
        """Remove the containers whose removal failed; those the daemon still does not answer for stay listed."""
        import docker.errors

        with self._lock:
            pending, self._unremoved = self._unremoved, {}
        for container_id, name in pending.items():
            try:
                client.api.remove_container(container_id, force=True, v=True)
                log.info("removed sandbox container %s, left when the daemon was away", name)
            except docker.errors.NotFound:
                pass
            except Exception:  # noqa: BLE001 - still away: try again later
                self.unremoved(container_id, name)

    def add(self, sandbox: DockerSandbox) -> None:
        with self._lock:
            if not self._hooked:
                atexit.register(self.close_all)
                os.register_at_fork(after_in_child=self._forget)
                self._hooked = True
            self._live[id(sandbox)] = sandbox

    def discard(self, sandbox: DockerSandbox) -> None:
        with self._lock:
            self._live.pop(id(sandbox), None)

    def close_all(self) -> None:
        if os.getpid() != self._pid:
            return
        with self._lock:
            live = list(self._live.values())
        for sandbox in live:
            try:
                sandbox.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("at exit: could not close %r: %s", sandbox, exc)
        if self._unremoved:
            deadline = time.monotonic() + _EXIT_WAIT_S
            while True:  # a restarting daemon answers again within seconds
                try:
                    client = connect()
                    break
                except DockerUnavailableError as exc:
                    if time.monotonic() > deadline:
                        log.warning("at exit: %d sandbox container(s) could not be removed (no daemon for %.0f s: "
                                    "%s); remove them with `sao-sandbox gc`", len(self._unremoved), _EXIT_WAIT_S, exc)
                        return
                    time.sleep(1.0)
            try:
                self.remove_unremoved(client)
            finally:
                client.close()

    def _forget(self) -> None:
        self._live = {}
        self._unremoved = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()


registry = Registry()
"""This process's one registry of live sandbox containers."""
