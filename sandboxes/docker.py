"""One Docker container per sandbox, driven through the Docker SDK (no CLI needed).

The container runs ``sleep infinity`` under Docker's init (``--init``: tini reaps orphans) with
the limits of :class:`~sao.sandboxes.base.SandboxLimits`: CPUs, memory (swap = memory, so no
swap), a pids limit, no network (``network_mode="none"``: loopback only) unless asked, every
capability dropped, and ``no-new-privileges``. Commands run as the image's user (root in
``sao-base``), which without capabilities can still write the files it owns but cannot
``chown``, bypass file permissions, mount, or trace other users' processes.

How a command runs (:meth:`DockerSandbox.run`, :mod:`.docker_exec`): one ``docker exec`` of a small
POSIX ``sh`` wrapper (``_WRAPPER``) that

1. starts the command as ``setsid sh -c COMMAND`` (its own session and process group) with a
   per-run tag ``SAO_RUN_ID=<random>`` in its environment, which every descendant inherits;
2. starts a timer (``sleep T``, also tagged) that signals the wrapper when the time is up;
3. when the command ends, or the timer fires, kills the command's process group and then every
   process whose environment carries the tag (read from ``/proc/*/environ``), repeating until
   none is left. A command that ``setsid``\\s or double-forks is still caught by its tag; one
   that also clears its environment (``env -i setsid ...``) escapes until the container is
   removed. **Background processes never outlive ``run()``**: a server started with ``&`` is
   killed when the command that started it returns.
4. on a timeout, prints a sentinel that the client turns into ``timed_out=True``, exit code
   124 and a readable marker line.

The client also keeps its own deadline (time limit + ``client_grace_s``), so a hung exec API
call (a paused container, a stuck daemon) cannot hang the caller: on expiry a second exec kills
the tagged processes, and if the stream still has not ended ``kill_grace_s`` later it is closed
from the client side; the result is a timeout. (A process that escaped the tag and still holds
the output pipe cannot hang an exec either: Docker closes an exec's streams 2 s after its main
process exits.)

Clean-up (:mod:`.docker_cleanup`): :meth:`DockerSandbox.close` removes the container (idempotent);
``with`` closes on exceptions; live sandboxes are removed at interpreter exit (``atexit``; not in
forked children). A removal that fails because the daemon is away (restarted, say) is not
forgotten: the container is removed when this process next starts a sandbox (the daemon answers
again) or at its exit (waiting up to 30 s for the daemon). The library installs no signal
handlers: Python's default SIGTERM kills the process without running ``atexit``, so a program
that wants clean-up on SIGTERM should install ``signal.signal(signal.SIGTERM, lambda *_:
sys.exit(143))`` itself. After a SIGKILL nothing runs; every container carries the label
``io.sao.sandbox=<label>``, and :func:`gc` (or ``sao-sandbox gc [--label VALUE]``) removes the
leftovers.

File operations (:mod:`.docker_files`) use the archive API (``get_archive``/``put_archive``: a tar
in memory), which needs no network inside the container; ``list_dir`` and the creation of missing
parent directories use a small exec.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from .base import ExecResult, SandboxLimits
from .docker_cleanup import LABEL_KEY, LABEL_VALUE, OWNER_LABEL_KEY, connect, gc, reap_once, registry
from .docker_exec import ContainerExec
from .docker_files import ContainerFiles
from .errors import SandboxClosedError, SandboxStartError
from .orphans import owner_label

__all__ = ["LABEL_KEY", "LABEL_VALUE", "OWNER_LABEL_KEY", "DockerSandbox", "connect", "gc"]

log = logging.getLogger(__name__)


class DockerSandbox:
    """A sandbox in a fresh container of ``image``; the container is created and started here.

    ``label`` is the value of the ``io.sao.sandbox`` label (use a per-run value to let
    :func:`gc` clean up after one run only). ``workdir`` is the container's working directory
    (created by Docker when missing) and the base of relative paths. ``volumes`` is passed to
    Docker as is (``{"/host/dir": {"bind": "/data", "mode": "ro"}}``). ``cap_add`` adds back
    capabilities (e.g. ``["CHOWN", "DAC_OVERRIDE", "FOWNER"]`` for images whose files root
    must modify although it does not own them); none are needed for ordinary work. ``platform``
    (``linux/amd64``, ...) asks for that variant of the image (an amd64 image on an arm64 host);
    None: the daemon's choice.

    Raises :class:`DockerUnavailableError` when no daemon answers, :class:`SandboxStartError`
    when the image is missing (it is never pulled) or the container does not start.
    """

    client_grace_s: float = 15.0
    """How far past a command's time limit the client waits for the exec before intervening."""
    kill_grace_s: float = 5.0
    """After intervening, how long to wait for the exec's stream before closing it."""

    def __init__(self, image: str, *, limits: SandboxLimits = SandboxLimits(), label: str = LABEL_VALUE,
                 name_prefix: str = "sao-", workdir: str = "/", client: Any = None,
                 volumes: Mapping[str, Any] | None = None, cap_add: Iterable[str] = (), platform: str | None = None):
        if not posixpath.isabs(workdir):
            raise ValueError(f"workdir must be an absolute path in the container (got {workdir!r})")
        self.image = image
        self.limits = limits
        self.label = label
        self.workdir = workdir
        self.platform = platform
        self.name = f"{name_prefix}{uuid.uuid4().hex[:12]}"
        self._own_client = client is None
        self._client = connect() if client is None else client
        self._closed = False
        self._lock = threading.Lock()
        self._container = self._start(volumes, list(cap_add))
        self._exec = ContainerExec(self._client, self._container.id, self.name, self._check_open)
        self._files = ContainerFiles(self._container, self._exec)

    # -- life cycle -------------------------------------------------------------------------

    def _start(self, volumes: Mapping[str, Any] | None, cap_add: list[str]) -> Any:
        import docker.errors

        lim = self.limits
        reap_once(self._client)  # a SIGKILLed run's containers go before this process adds its own
        try:
            container = self._client.containers.create(
                self.image, command=["sleep", "infinity"], name=self.name, detach=True,
                labels={LABEL_KEY: self.label, OWNER_LABEL_KEY: owner_label()},
                network_mode=None if lim.network else "none",
                nano_cpus=int(lim.cpus * 1e9), mem_limit=f"{lim.memory_mb}m", memswap_limit=f"{lim.memory_mb}m",
                pids_limit=lim.pids, cap_drop=["ALL"], cap_add=cap_add or None,
                security_opt=["no-new-privileges"], init=True, working_dir=self.workdir,
                volumes=dict(volumes) if volumes else None, **({"platform": self.platform} if self.platform else {}),
            )
        except docker.errors.ImageNotFound as exc:
            self._close_client()
            raise SandboxStartError(
                f"image {self.image!r} is not present (sandboxes never pull); build the base image with "
                f"`sao-sandbox build-base` or load/build {self.image!r} first") from exc
        except Exception as exc:  # noqa: BLE001 - API or connection error
            # The daemon may have made the container before the connection broke (a daemon going down
            # answers nothing more): it is looked for by its name once the daemon answers again, here
            # below, by this process's next sandbox, or at exit, and removed if it is there.
            registry.unremoved(self.name, self.name)
            registry.remove_unremoved(self._client)
            self._close_client()
            raise SandboxStartError(f"cannot create a container of {self.image!r}: {exc}") from exc
        self._container = container
        registry.add(self)
        registry.remove_unremoved(self._client)  # the daemon answers: containers it lost track of go now
        try:
            container.start()
        except Exception as exc:  # noqa: BLE001 - API or connection error
            self.close()
            raise SandboxStartError(f"container {self.name} of {self.image!r} did not start: {exc}") from exc
        return container

    @property
    def id(self) -> str:
        return self._container.id

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Remove the container (forced); idempotent. A container already gone is not an error."""
        import docker.errors

        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # noqa: BLE001 - the daemon went away: removed once it answers again
            log.warning("could not remove sandbox container %s: %s (removed when the daemon answers again, or "
                        "with `sao-sandbox gc`)", self.name, exc)
            registry.unremoved(self._container.id, self.name)
        finally:
            registry.discard(self)
            self._close_client()

    def _close_client(self) -> None:
        if self._own_client:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"DockerSandbox({self.image!r}, name={self.name!r}, {state})"

    # -- the Sandbox protocol: commands (.docker_exec) and files (.docker_files) ---------------

    def run(self, command: str, *, timeout_s: float | None = None, workdir: str | None = None,
            env: dict[str, str] | None = None) -> ExecResult:
        """Run ``command`` with ``sh -c`` in ``workdir``; see the module docstring for the kill rules."""
        if "\0" in command:
            raise ValueError("command contains a NUL byte")
        return self._exec.run(command, limit=self.limits.timeout_for(timeout_s), cwd=self._abs(workdir or "."),
                              env=env, output_limit_bytes=self.limits.output_limit_bytes,
                              client_grace_s=self.client_grace_s, kill_grace_s=self.kill_grace_s)

    def read_file(self, path: str) -> bytes:
        self._check_open()
        return self._files.read(self._abs(path), path)

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._files.write(self._abs(path), path, payload, mode)

    def list_dir(self, path: str) -> list[str]:
        return self._files.list_dir(self._abs(path), path)

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.name} is closed")
