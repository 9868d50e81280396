"""One Docker container per sandbox, driven through the Docker SDK (no CLI needed).

The container runs ``sleep infinity`` under Docker's init (``--init``: tini reaps orphans) with
the limits of :class:`~sao.sandboxes.base.SandboxLimits`: CPUs, memory (swap = memory, so no
swap), a pids limit, no network (``network_mode="none"``: loopback only) unless asked, every
capability dropped, and ``no-new-privileges``. Commands run as the image's user (root in
``sao-base``), which without capabilities can still write the files it owns but cannot
``chown``, bypass file permissions, mount, or trace other users' processes.

How a command runs (:meth:`DockerSandbox.run`): one ``docker exec`` of a small POSIX ``sh``
wrapper (``_WRAPPER``) that

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

Clean-up: :meth:`DockerSandbox.close` removes the container (idempotent); ``with`` closes on
exceptions; live sandboxes are removed at interpreter exit (``atexit``; not in forked
children). A removal that fails because the daemon is away (restarted, say) is not forgotten:
the container is removed when this process next starts a sandbox (the daemon answers again) or
at its exit (waiting up to 30 s for the daemon). The library installs no signal handlers: Python's default SIGTERM kills the process
without running ``atexit``, so a program that wants clean-up on SIGTERM should install
``signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))`` itself. After a SIGKILL nothing
runs; every container carries the label ``io.sao.sandbox=<label>``, and :func:`gc` (or
``sao-sandbox gc [--label VALUE]``) removes the leftovers.

File operations use the archive API (``get_archive``/``put_archive``: a tar in memory), which
needs no network inside the container; ``list_dir`` and the creation of missing parent
directories use a small exec.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import posixpath
import tarfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from .base import TIMEOUT_EXIT_CODE, ExecResult, OutputBuffer, SandboxLimits, timeout_marker
from .errors import DockerUnavailableError, SandboxClosedError, SandboxError, SandboxStartError
from .orphans import OnceReaper, list_labelled, owner_label

log = logging.getLogger(__name__)

LABEL_KEY = "io.sao.sandbox"
"""Label every sandbox container carries; its value is the ``label`` argument (default ``"1"``)."""
LABEL_VALUE = "1"
OWNER_LABEL_KEY = "io.sao.sandbox.owner"
"""``host:pid`` of the process that created the container: a dead one's are removed (:mod:`.orphans`)."""


_SENTINEL = "__SAO_TIMEOUT_{}__"

# Kills every process (but the caller) whose environment holds SAO_RUN_ID=$id, until none is left.
_KILL_TAGGED = r"""
kill_tagged() {
    n=0
    while [ "$n" -lt 50 ]; do
        pids=
        for f in $(grep -lsxzF "SAO_RUN_ID=$1" /proc/[0-9]*/environ 2>/dev/null); do
            p=${f#/proc/}; p=${p%/environ}
            [ "$p" = "$$" ] || pids="$pids $p"
        done
        [ -z "$pids" ] && return 0
        kill -KILL $pids 2>/dev/null
        n=$((n + 1))
    done
}
"""

# argv: $1 run id, $2 time limit in seconds, $3 working directory, $4 the command.
_WRAPPER = _KILL_TAGGED + r"""
id=$1 limit=$2 wd=$3 cmd=$4
cd -- "$wd" || exit 126
expired=
trap 'expired=1' USR1
SAO_RUN_ID=$id setsid sh -c "$cmd" &
child=$!
( SAO_RUN_ID=$id sleep "$limit" && kill -USR1 $$ ) </dev/null >/dev/null 2>&1 &
wait "$child"
rc=$?
if [ -n "$expired" ]; then
    kill -KILL "-$child" 2>/dev/null
    kill_tagged "$id"
    wait "$child" 2>/dev/null
    printf '__SAO_TIMEOUT_%s__' "$id"
    exit 124
fi
trap '' USR1
kill -KILL "-$child" 2>/dev/null
kill_tagged "$id"
exit "$rc"
"""

_KILL_RUN = _KILL_TAGGED + r"""
kill_tagged "$1"
"""

# argv: $1 directory. Exit 3: missing, 4: not a directory, 5: cannot enter. NUL-separated names.
_LIST_DIR = r"""
[ -e "$1" ] || [ -L "$1" ] || exit 3
[ -d "$1" ] || exit 4
cd -- "$1" || exit 5
for f in .* *; do
    case $f in .|..) continue ;; esac
    [ -e "$f" ] || [ -L "$f" ] || continue
    printf '%s\0' "$f"
done
"""

_GO_MODE_DIR = 1 << 31  # Go's os.ModeDir in the archive stat header
_GO_MODE_SYMLINK = 1 << 27


class DockerSandbox:
    """A sandbox in a fresh container of ``image``; the container is created and started here.

    ``label`` is the value of the ``io.sao.sandbox`` label (use a per-run value to let
    :func:`gc` clean up after one run only). ``workdir`` is the container's working directory
    (created by Docker when missing) and the base of relative paths. ``volumes`` is passed to
    Docker as is (``{"/host/dir": {"bind": "/data", "mode": "ro"}}``). ``cap_add`` adds back
    capabilities (e.g. ``["CHOWN", "DAC_OVERRIDE", "FOWNER"]`` for images whose files root
    must modify although it does not own them); none are needed for ordinary work.

    Raises :class:`DockerUnavailableError` when no daemon answers, :class:`SandboxStartError`
    when the image is missing (it is never pulled) or the container does not start.
    """

    client_grace_s: float = 15.0
    """How far past a command's time limit the client waits for the exec before intervening."""
    kill_grace_s: float = 5.0
    """After intervening, how long to wait for the exec's stream before closing it."""

    def __init__(self, image: str, *, limits: SandboxLimits = SandboxLimits(), label: str = LABEL_VALUE,
                 name_prefix: str = "sao-", workdir: str = "/", client: Any = None,
                 volumes: Mapping[str, Any] | None = None, cap_add: Iterable[str] = ()):
        if not posixpath.isabs(workdir):
            raise ValueError(f"workdir must be an absolute path in the container (got {workdir!r})")
        self.image = image
        self.limits = limits
        self.label = label
        self.workdir = workdir
        self.name = f"{name_prefix}{uuid.uuid4().hex[:12]}"
        self._own_client = client is None
        self._client = connect() if client is None else client
        self._closed = False
        self._lock = threading.Lock()
        self._container = self._start(volumes, list(cap_add))

    # -- life cycle -------------------------------------------------------------------------

    def _start(self, volumes: Mapping[str, Any] | None, cap_add: list[str]) -> Any:
        import docker.errors

        lim = self.limits
        _reap_once(self._client)  # a SIGKILLed run's containers go before this process adds its own
        try:
            container = self._client.containers.create(
                self.image, command=["sleep", "infinity"], name=self.name, detach=True,
                labels={LABEL_KEY: self.label, OWNER_LABEL_KEY: owner_label()},
                network_mode=None if lim.network else "none",
                nano_cpus=int(lim.cpus * 1e9), mem_limit=f"{lim.memory_mb}m", memswap_limit=f"{lim.memory_mb}m",
                pids_limit=lim.pids, cap_drop=["ALL"], cap_add=cap_add or None,
                security_opt=["no-new-privileges"], init=True, working_dir=self.workdir,
                volumes=dict(volumes) if volumes else None,
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
            _registry.unremoved(self.name, self.name)
            _registry.remove_unremoved(self._client)
            self._close_client()
            raise SandboxStartError(f"cannot create a container of {self.image!r}: {exc}") from exc
        self._container = container
        _registry.add(self)
        _registry.remove_unremoved(self._client)  # the daemon answers: containers it lost track of go now
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
            _registry.unremoved(self._container.id, self.name)
        finally:
            _registry.discard(self)
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

    # -- commands ---------------------------------------------------------------------------

    def run(self, command: str, *, timeout_s: float | None = None, workdir: str | None = None,
            env: dict[str, str] | None = None) -> ExecResult:
        """Run ``command`` with ``sh -c`` in ``workdir``; see the module docstring for the kill rules."""
        if "\0" in command:
            raise ValueError("command contains a NUL byte")
        limit = self.limits.timeout_for(timeout_s)
        run_id = uuid.uuid4().hex
        sentinel = _SENTINEL.format(run_id).encode()
        cwd = self._abs(workdir or ".")
        argv = ["sh", "-c", _WRAPPER, "sao-run", run_id, f"{limit:.3f}", cwd, command]
        started = time.monotonic()
        exec_id = self._exec_create(argv, env)
        buffer = OutputBuffer(self.limits.output_limit_bytes, suffix=sentinel)
        state: dict[str, Any] = {}

        def pump() -> None:
            try:
                stream = self._client.api.exec_start(exec_id, stream=True, demux=False)
                state["stream"] = stream
                for chunk in stream:
                    buffer.add(chunk)
            except Exception as exc:  # noqa: BLE001 - reported to the caller below
                state["error"] = exc

        reader = threading.Thread(target=pump, name=f"{self.name}-exec", daemon=True)
        reader.start()
        reader.join(limit + self.client_grace_s)
        client_timeout = reader.is_alive()
        if client_timeout:
            log.warning("sandbox %s: exec did not return %.0f s after its %.1f s limit; killing it from outside",
                        self.name, self.client_grace_s, limit)
            self._kill_run(run_id)
            reader.join(self.kill_grace_s)
            if reader.is_alive() and "stream" in state:
                try:
                    state["stream"].close()
                except Exception:  # noqa: BLE001
                    pass
                reader.join(1.0)
        if "error" in state and not client_timeout:
            self._raise_if_gone(state["error"])
            raise SandboxError(f"sandbox {self.name}: exec failed: {state['error']}") from state["error"]
        text, truncated, wrapper_timeout = buffer.finish()
        timed_out = client_timeout or wrapper_timeout
        if timed_out:
            exit_code = TIMEOUT_EXIT_CODE
            text += timeout_marker(limit)
        else:
            exit_code = self._exit_code(exec_id)
        return ExecResult(exit_code=exit_code, output=text, timed_out=timed_out, truncated=truncated,
                          duration_s=time.monotonic() - started)

    def _exec_create(self, argv: list[str], env: Mapping[str, str] | None) -> str:
        self._check_open()
        try:
            return self._client.api.exec_create(self._container.id, argv, stdout=True, stderr=True, stdin=False,
                                                tty=False, environment=dict(env) if env else None)["Id"]
        except Exception as exc:  # noqa: BLE001
            self._raise_if_gone(exc)
            raise SandboxError(f"sandbox {self.name}: cannot start a command: {exc}") from exc

    def _exit_code(self, exec_id: str) -> int:
        # The stream can end a moment before the daemon records the exit code.
        for _ in range(50):
            try:
                info = self._client.api.exec_inspect(exec_id)
            except Exception as exc:  # noqa: BLE001
                self._raise_if_gone(exc)
                raise SandboxError(f"sandbox {self.name}: cannot inspect a command: {exc}") from exc
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        raise SandboxError(f"sandbox {self.name}: the daemon did not report the command's exit code")

    def _exec(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        """A short helper command (no wrapper, no time limit): ``(exit_code, stdout, stderr)``."""
        exec_id = self._exec_create(argv, None)
        try:
            out, err = self._client.api.exec_start(exec_id, stream=False, demux=True)
        except Exception as exc:  # noqa: BLE001
            self._raise_if_gone(exc)
            raise SandboxError(f"sandbox {self.name}: exec failed: {exc}") from exc
        return self._exit_code(exec_id), out or b"", err or b""

    def _kill_run(self, run_id: str) -> None:
        try:
            self._exec(["sh", "-c", _KILL_RUN, "sao-kill", run_id])
        except SandboxError as exc:
            log.warning("sandbox %s: could not kill run %s: %s", self.name, run_id, exc)

    # -- files ------------------------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        import docker.errors

        self._check_open()
        target = self._abs(path)
        for _ in range(8):  # follow symlinks
            try:
                stream, stat = self._container.get_archive(target)
                data = b"".join(stream)
            except docker.errors.NotFound as exc:
                self._raise_if_gone(exc)
                raise FileNotFoundError(f"{path}: no such file in sandbox {self.name}") from exc
            except docker.errors.DockerException as exc:
                self._raise_if_gone(exc)
                raise SandboxError(f"sandbox {self.name}: cannot read {path}: {exc}") from exc
            mode = int(stat.get("mode", 0))
            if mode & _GO_MODE_DIR:
                raise IsADirectoryError(f"{path}: is a directory in sandbox {self.name}")
            if mode & _GO_MODE_SYMLINK and stat.get("linkTarget"):
                target = posixpath.join(posixpath.dirname(target), stat["linkTarget"])
                continue
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member in tar:
                    if member.isfile():
                        extracted = tar.extractfile(member)
                        assert extracted is not None
                        return extracted.read()
            raise SandboxError(f"sandbox {self.name}: {path} is not a regular file")
        raise SandboxError(f"sandbox {self.name}: too many levels of symbolic links at {path}")

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        import docker.errors

        self._check_open()
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        target = self._abs(path)
        parent, name = posixpath.split(target)
        if not name:
            raise IsADirectoryError(f"{path}: not a file path")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), mode, int(time.time())
            tar.addfile(info, io.BytesIO(payload))
        archive = buf.getvalue()
        for attempt in range(2):
            try:
                self._container.put_archive(parent, archive)
                return
            except docker.errors.NotFound as exc:
                self._raise_if_gone(exc)
                if attempt:
                    raise SandboxError(f"sandbox {self.name}: cannot create {parent}") from exc
                code, _, err = self._exec(["mkdir", "-p", "--", parent])
                if code:
                    raise SandboxError(f"sandbox {self.name}: mkdir -p {parent} failed: "
                                       f"{err.decode(errors='replace').strip()}") from exc
            except docker.errors.DockerException as exc:
                self._raise_if_gone(exc)
                raise SandboxError(f"sandbox {self.name}: cannot write {path}: {exc}") from exc

    def list_dir(self, path: str) -> list[str]:
        target = self._abs(path)
        code, out, err = self._exec(["sh", "-c", _LIST_DIR, "sao-ls", target])
        if code == 3:
            raise FileNotFoundError(f"{path}: no such directory in sandbox {self.name}")
        if code == 4:
            raise NotADirectoryError(f"{path}: not a directory in sandbox {self.name}")
        if code:
            raise SandboxError(f"sandbox {self.name}: cannot list {path}: {err.decode(errors='replace').strip()}")
        return sorted(name.decode("utf-8", errors="surrogateescape") for name in out.split(b"\0") if name)

    # -- helpers ----------------------------------------------------------------------------

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.name} is closed")

    def _raise_if_gone(self, exc: BaseException) -> None:
        """Turn 'no such container' / 'container is not running' into SandboxClosedError."""
        import docker.errors

        text = str(exc).lower()
        gone = isinstance(exc, docker.errors.NotFound) and "no such container" in text
        stopped = isinstance(exc, docker.errors.APIError) and "is not running" in text
        if gone or stopped:
            raise SandboxClosedError(f"sandbox {self.name}: its container is gone or stopped ({exc})") from exc


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


_reap_once = OnceReaper()

_EXIT_WAIT_S = 30.0  # at exit, how long to wait for an absent daemon to remove the containers it still has


class _Registry:
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


_registry = _Registry()
