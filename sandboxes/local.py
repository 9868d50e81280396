"""A sandbox on this machine: a private directory and one subprocess per command.

Isolation, strongest available:

* **bubblewrap** (``bwrap``), when it is installed and can create namespaces here (probed once
  per process): the whole file system is mounted read-only, except the sandbox root (writable,
  at the same path, and the working directory) and a private ``/tmp`` that lasts as long as the
  sandbox; fresh ``/dev`` and ``/proc``; new PID, IPC and UTS namespaces, and a new network
  namespace (loopback only) unless ``limits.network``; ``--die-with-parent`` and
  ``--new-session``. Killing ``bwrap`` kills everything in its PID namespace, so nothing the
  command starts can outlive it. As root (this project's CI) bwrap works as is; as a normal
  user it needs unprivileged user namespaces (Ubuntu 24.04 restricts them through AppArmor).
* **a plain subprocess** only when asked for: ``use_bwrap=False``, or ``SAO_SANDBOX_UNISOLATED=1`` in
  the environment when bubblewrap is not usable (a warning is logged once). Same directory layout but no
  file-system or network isolation; **use it only for trusted code and tests**. Without bubblewrap and
  without that opt-in, ``LocalSandbox()`` raises :class:`~sao.sandboxes.errors.SandboxStartError`: a
  model's code never runs unisolated by default.

In both modes each command runs as ``sh -c`` in its own session (``start_new_session``) with a
minimal environment (``PATH``, ``HOME`` = the root, ``TMPDIR``, ``LANG`` and the ``env``
argument; nothing of the caller's environment, so no API keys leak), with ``RLIMIT_AS`` =
``limits.memory_mb`` and, best effort, ``RLIMIT_NPROC`` (ignored for root, and counted per
user, so it is set to the user's current process count plus ``limits.pids``). ``limits.cpus``
is not enforced. When the command ends or times out, its process group is killed, and so is
every process of ours whose environment carries the run's tag (``SAO_RUN_ID``), as in the
Docker sandbox: background processes do not outlive ``run()``.

Paths: relative paths (and ``workdir``) are relative to the root; absolute paths must lie inside
the root. Anything that resolves outside (``..``, a symlink pointing out) raises
:class:`~sao.sandboxes.errors.SandboxPathError`.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from .base import TIMEOUT_EXIT_CODE, ExecResult, OutputBuffer, SandboxLimits, timeout_marker
from .errors import SandboxClosedError, SandboxError, SandboxPathError, SandboxStartError
from .tagged import kill_tagged

log = logging.getLogger(__name__)

_TAG_VAR = "SAO_RUN_ID"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


UNISOLATED_VAR = "SAO_SANDBOX_UNISOLATED"
"""Set to ``1`` to let :class:`LocalSandbox` run commands as plain subprocesses where bubblewrap is not usable."""


def require_isolation() -> bool:
    """Whether a default :class:`LocalSandbox` (``use_bwrap=None``) uses bubblewrap: True when it is usable;
    False (with a warning, once) when it is not and :data:`UNISOLATED_VAR` is ``1``; otherwise
    :class:`SandboxStartError`, saying how to get isolation."""
    if bwrap_usable():
        return True
    if os.environ.get(UNISOLATED_VAR) == "1":
        _warn_unisolated()
        return False
    raise SandboxStartError(
        "the local sandbox has no isolation here: bubblewrap (`bwrap`) is missing or cannot create namespaces. "
        "Install it (apt-get install -y bubblewrap; scripts/setup does as root), use the Docker sandbox "
        f"(sandbox=docker), or set {UNISOLATED_VAR}=1 to run the model's code as plain subprocesses "
        "without file-system or network isolation (trusted code only)")


@functools.lru_cache(maxsize=None)
def bwrap_usable() -> bool:
    """Whether ``bwrap`` is installed and can create the namespaces we use (probed once)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    probe = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-net",
             "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session", "true"]
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("bwrap is installed but cannot run (%s)", exc)
        return False
    if proc.returncode != 0:
        log.warning("bwrap is installed but cannot create namespaces here: %s", proc.stderr.strip())
        return False
    return True


class LocalSandbox:
    """Commands in a private directory on this machine (see the module docstring).

    ``root`` is used as is and kept on close; without it a temporary directory is created and
    removed on close. ``use_bwrap``: ``None`` uses bubblewrap, or a plain subprocess only where it is
    not usable and :data:`UNISOLATED_VAR` opts in (:func:`require_isolation`; else
    :class:`SandboxStartError`), ``True`` requires it (:class:`SandboxStartError` if unusable),
    ``False`` never uses it (trusted code and tests).
    """

    def __init__(self, limits: SandboxLimits = SandboxLimits(), root: str | os.PathLike[str] | None = None, *,
                 use_bwrap: bool | None = None):
        self.limits = limits
        if use_bwrap and not bwrap_usable():
            raise SandboxStartError("bubblewrap was required (use_bwrap=True) but `bwrap` is missing or cannot "
                                    "create namespaces here (apt-get install -y bubblewrap; as non-root it needs "
                                    "unprivileged user namespaces)")
        if use_bwrap is None:
            use_bwrap = require_isolation()
        self.isolated = bool(use_bwrap)
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="sao-local-") if root is None else root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix="sao-local-tmp-")).resolve()
        self._closed = False

    # -- life cycle -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Remove the private ``/tmp`` (and the root, when this sandbox created it); idempotent."""
        if self._closed:
            return
        self._closed = True
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "bwrap" if self.isolated else "plain"
        return f"LocalSandbox({str(self.root)!r}, {mode}, {'closed' if self._closed else 'open'})"

    # -- commands ---------------------------------------------------------------------------

    def run(self, command: str, *, timeout_s: float | None = None, workdir: str | None = None,
            env: dict[str, str] | None = None) -> ExecResult:
        self._check_open()
        limit = self.limits.timeout_for(timeout_s)
        cwd = self._resolve(workdir or ".")
        if not cwd.is_dir():
            raise NotADirectoryError(f"workdir {workdir!r} is not a directory in the sandbox")
        run_id = uuid.uuid4().hex
        environment = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "HOME": str(self.root), "LANG": "C.UTF-8",
                       "TMPDIR": "/tmp" if self.isolated else str(self._tmp), **(env or {}), _TAG_VAR: run_id}
        argv = self._bwrap_argv(cwd) + ["sh", "-c", command] if self.isolated else ["sh", "-c", command]
        started = time.monotonic()
        buffer = OutputBuffer(self.limits.output_limit_bytes)
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_rlimits(self.limits))
        except OSError as exc:
            raise SandboxError(f"cannot start a command in {self!r}: {exc}") from exc
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = started + limit
        timed_out = False
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                ready, _, _ = select.select([fd], [], [], min(remaining, 0.1))
                if ready:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break  # every writer is gone
                    buffer.add(chunk)
                elif proc.poll() is not None:
                    break  # the command ended but something it started still holds the pipe
            self._kill(proc.pid, run_id)
            self._drain(fd, buffer)
        finally:
            proc.stdout.close()
            exit_code = proc.wait()
        text, truncated, _ = buffer.finish()
        if timed_out:
            text += timeout_marker(limit)
            exit_code = TIMEOUT_EXIT_CODE
        elif exit_code < 0:  # killed by a signal: report it the way a shell does
            exit_code = 128 - exit_code
        return ExecResult(exit_code=exit_code, output=text, timed_out=timed_out, truncated=truncated,
                          duration_s=time.monotonic() - started)

    def _bwrap_argv(self, cwd: Path) -> list[str]:
        argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--bind", str(self._tmp), "/tmp", "--bind", str(self.root), str(self.root), "--chdir", str(cwd),
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
        if not self.limits.network:
            argv.append("--unshare-net")
        return argv + ["--"]

    @staticmethod
    def _kill(pgid: int, run_id: str) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        kill_tagged(_TAG_VAR, [run_id])

    @staticmethod
    def _drain(fd: int, buffer: OutputBuffer, grace_s: float = 1.0) -> None:
        """Read what is left in the pipe; stop at EOF or after ``grace_s`` (a holder escaped us)."""
        end = time.monotonic() + grace_s
        while (remaining := end - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            buffer.add(chunk)

    # -- files ------------------------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        self._check_open()
        return self._resolve(path).read_bytes()

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        target = self._resolve(path)
        if target == self.root:
            raise IsADirectoryError(f"{path}: is the sandbox root")
        target.parent.mkdir(parents=True, exist_ok=True)
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        target.write_bytes(payload)
        os.chmod(target, mode)

    def list_dir(self, path: str) -> list[str]:
        self._check_open()
        return sorted(os.listdir(self._resolve(path)))

    # -- helpers ----------------------------------------------------------------------------

    def _resolve(self, path: str) -> Path:
        """The real path of ``path`` in the sandbox; raises SandboxPathError when it leaves the root."""
        candidate = Path(path) if os.path.isabs(path) else self.root / path
        resolved = Path(os.path.realpath(candidate))
        if resolved != self.root and self.root not in resolved.parents:
            raise SandboxPathError(f"{path!r} resolves to {resolved}, outside the sandbox root {self.root}")
        return resolved

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"{self!r} is closed")


def _rlimits(limits: SandboxLimits):
    """A preexec_fn setting RLIMIT_AS and (best effort) RLIMIT_NPROC; computed before the fork."""
    memory = limits.memory_mb * 1024 * 1024
    nproc = _user_process_count() + limits.pids

    def apply() -> None:  # runs in the child between fork and exec: no locks, no logging
        for which, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_NPROC, nproc)):
            try:
                _soft, hard = resource.getrlimit(which)
                if hard != resource.RLIM_INFINITY:
                    value = min(value, hard)
                resource.setrlimit(which, (value, value if hard == resource.RLIM_INFINITY else hard))
            except (ValueError, OSError):
                pass

    return apply


def _user_process_count() -> int:
    uid = os.getuid()
    count = 0
    try:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        count += 1
                except OSError:
                    pass
    except OSError:
        return 0
    return count


_warned = threading.Event()


def _warn_unisolated() -> None:
    if not _warned.is_set():
        _warned.set()
        log.warning("bubblewrap is not usable here and %s=1: LocalSandbox runs commands as plain subprocesses, "
                    "without file-system or network isolation (trusted code only)", UNISOLATED_VAR)
