"""Scripted in-memory sandboxes for tests of code that uses sandboxes (no Docker, no processes).

:class:`FakeSandbox` answers commands from a script (exact command -> result, or a function),
records every command, and keeps files in a dict. :class:`FakeSandboxFactory` makes them and
counts how many are open at once, for pool and environment tests.
"""

from __future__ import annotations

import posixpath
import threading
import time
from collections.abc import Callable, Mapping

from .base import ExecResult, SandboxLimits
from .errors import SandboxClosedError

Script = Mapping[str, "ExecResult | str"] | Callable[[str], "ExecResult | str"]


class FakeSandbox:
    """A sandbox whose commands are answered from ``script``.

    ``script`` maps a command to its result (an :class:`ExecResult`, or a ``str`` meaning exit 0
    with that output), or is a function of the command. Unknown commands return exit 127 with
    ``sh: CMD: not found``. ``files`` seeds the file system (absolute paths). ``commands`` lists
    what was run, in order.
    """

    def __init__(self, script: Script | None = None, *, files: Mapping[str, bytes | str] | None = None,
                 limits: SandboxLimits = SandboxLimits(), workdir: str = "/", name: str = "fake"):
        self.script = script or {}
        self.limits = limits
        self.workdir = workdir
        self.name = name
        self.files: dict[str, bytes] = {}
        self.commands: list[str] = []
        self.closed = False
        for path, data in (files or {}).items():
            self.write_file(path, data)

    def run(self, command: str, *, timeout_s: float | None = None, workdir: str | None = None,
            env: dict[str, str] | None = None) -> ExecResult:
        self._check_open()
        self.limits.timeout_for(timeout_s)
        self.commands.append(command)
        if callable(self.script):
            answer = self.script(command)
        elif command in self.script:
            answer = self.script[command]
        else:
            answer = ExecResult(exit_code=127, output=f"sh: 1: {command.split()[0] if command.split() else ''}: "
                                                      "not found\n")
        return ExecResult(exit_code=0, output=answer) if isinstance(answer, str) else answer

    def read_file(self, path: str) -> bytes:
        self._check_open()
        key = self._abs(path)
        if key not in self.files:
            if any(name.startswith(key.rstrip("/") + "/") for name in self.files):
                raise IsADirectoryError(path)
            raise FileNotFoundError(path)
        return self.files[key]

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        self.files[self._abs(path)] = data.encode("utf-8") if isinstance(data, str) else bytes(data)

    def list_dir(self, path: str) -> list[str]:
        self._check_open()
        prefix = self._abs(path).rstrip("/") + "/"
        names = {name[len(prefix):].split("/", 1)[0] for name in self.files if name.startswith(prefix)}
        if not names:
            if prefix.rstrip("/") in self.files:
                raise NotADirectoryError(path)
            if prefix != "/":
                raise FileNotFoundError(path)
        return sorted(names)

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxClosedError(f"fake sandbox {self.name} is closed")


class FakeSandboxFactory:
    """Makes :class:`FakeSandbox`\\es (optionally slowly) and records how many are open at once.

    ``fail_after``: the n-th call and later raise ``start_error`` (to test start failures).
    """

    def __init__(self, script: Script | None = None, *, start_delay_s: float = 0.0, fail_after: int | None = None,
                 start_error: Exception | None = None):
        self.script = script
        self.start_delay_s = start_delay_s
        self.fail_after = fail_after
        self.start_error = start_error or RuntimeError("fake start failure")
        self.created: list[FakeSandbox] = []
        self.max_open = 0
        self._lock = threading.Lock()

    def __call__(self) -> FakeSandbox:
        if self.start_delay_s:
            time.sleep(self.start_delay_s)
        with self._lock:
            if self.fail_after is not None and len(self.created) >= self.fail_after:
                raise self.start_error
            sandbox = FakeSandbox(self.script, name=f"fake-{len(self.created)}")
            self.created.append(sandbox)
            self.max_open = max(self.max_open, self.open_count)
        return sandbox

    @property
    def open_count(self) -> int:
        return sum(1 for sb in self.created if not sb.closed)

