"""The sandbox contract: the :class:`Sandbox` protocol and its typed records.

A sandbox is a place where untrusted (agent-written) shell commands run, with a file API beside
them. Docker, local and fake sandboxes implement the same protocol and are interchangeable;
none of them inherits from it.

Output rules, shared by every implementation: stdout and stderr are combined in arrival order,
decoded as UTF-8 with ``errors="replace"`` (binary output never raises), and capped at
``SandboxLimits.output_limit_bytes`` by keeping the head and the tail around a marker
``\\n[... output truncated: N bytes omitted ...]\\n``. A timed-out command ends with
``\\n[... command timed out after T s and was killed ...]\\n`` and has exit code 124.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

TIMEOUT_EXIT_CODE = 124
"""Exit code of a command killed for running past its time limit (as coreutils ``timeout``)."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did.

    ``output`` is stdout and stderr combined, decoded and possibly truncated (``truncated``).
    ``timed_out`` commands were killed with their whole process tree; their ``exit_code`` is 124.
    ``duration_s`` is wall-clock time seen by the caller, start-up of the exec included.
    """

    exit_code: int
    output: str
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox. ``network=False`` means no network at all (loopback only)."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 256
    network: bool = False
    output_limit_bytes: int = 64_000
    default_timeout_s: float = 60

    def __post_init__(self) -> None:
        problems = []
        if not (self.cpus > 0 and math.isfinite(self.cpus)):
            problems.append(f"cpus must be > 0 (got {self.cpus})")
        if self.memory_mb < 16:
            problems.append(f"memory_mb must be >= 16 (got {self.memory_mb})")
        if self.pids < 8:
            problems.append(f"pids must be >= 8 (got {self.pids}); the sandbox's own helpers need a few")
        if self.output_limit_bytes < 256:
            problems.append(f"output_limit_bytes must be >= 256 (got {self.output_limit_bytes})")
        if not self.default_timeout_s > 0:
            problems.append(f"default_timeout_s must be > 0 (got {self.default_timeout_s})")
        if problems:
            raise ValueError("invalid SandboxLimits: " + "; ".join(problems))

    def overridden(self, given: SandboxLimits | Mapping[str, Any] | None) -> SandboxLimits:
        """``given`` where it says something, these limits elsewhere: a :class:`SandboxLimits` replaces
        them, a mapping (from a command line or a config: ``{"cpus": 4}``) overrides the fields it
        names, None keeps them. An unknown field is a ValueError that lists the known ones."""
        if given is None:
            return self
        if isinstance(given, SandboxLimits):
            return given
        if not isinstance(given, Mapping):
            raise ValueError(f"limits must be a SandboxLimits or a mapping of its fields, got {type(given).__name__}")
        known = [f.name for f in dataclasses.fields(self)]
        if unknown := sorted(set(given) - set(known)):
            raise ValueError(f"unknown sandbox limit(s) {unknown}; the limits are {known}")
        return dataclasses.replace(self, **given)

    def timeout_for(self, timeout_s: float | None) -> float:
        """The time limit of one command: ``timeout_s`` or the default; must be positive."""
        t = self.default_timeout_s if timeout_s is None else float(timeout_s)
        if not (t > 0 and math.isfinite(t)):
            raise ValueError(f"timeout_s must be a positive number of seconds (got {timeout_s!r})")
        return t


@runtime_checkable
class Sandbox(Protocol):
    """Runs shell commands and reads/writes files in an isolated place.

    Relative paths (and ``workdir``) are relative to the sandbox's working directory. Concrete
    sandboxes are context managers (``with DockerSandbox(...) as sb:``) that close on exit;
    ``close`` is idempotent, and every other method raises ``SandboxClosedError`` after it.
    """

    def run(self, command: str, *, timeout_s: float | None = None, workdir: str | None = None,
            env: dict[str, str] | None = None) -> ExecResult:
        """Run ``command`` with ``sh -c``; never raises for the command's own failure or timeout."""
        ...

    def read_file(self, path: str) -> bytes: ...

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create or replace a file (parent directories are created); ``str`` is written as UTF-8."""
        ...

    def list_dir(self, path: str) -> list[str]:
        """Names of the entries of a directory, sorted, without ``.`` and ``..``."""
        ...

    def close(self) -> None: ...


class OutputBuffer:
    """Collects a command's output in bounded memory: the first and last ``limit/2`` bytes.

    ``suffix`` is a sentinel the in-sandbox wrapper may print last (the timeout mark); it is
    recognised at the very end of the stream, removed, and reported by :meth:`finish`.
    """

    def __init__(self, limit: int, suffix: bytes = b""):
        self.limit = limit
        self.suffix = suffix
        self._head_cap = limit // 2
        # Keep a little more tail than shown so that the sentinel is never cut.
        self._tail_keep = max(limit - self._head_cap, len(suffix)) + len(suffix)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > 2 * self._tail_keep:
                del self._tail[:-self._tail_keep]

    def finish(self) -> tuple[str, bool, bool]:
        """``(text, truncated, suffix_seen)``."""
        head, tail, total = bytes(self._head), bytes(self._tail), self.total
        head_cap, tail_cap = self._head_cap, self.limit - self._head_cap
        complete = len(head) + len(tail) == total
        seen = False
        if complete:
            data = head + tail
            if self.suffix and data.endswith(self.suffix):
                data, seen = data[: -len(self.suffix)], True
            if len(data) <= self.limit:
                return _decode(data), False, seen
            head, tail, omitted = data[:head_cap], data[len(data) - tail_cap:], len(data) - self.limit
        else:  # the middle was dropped; `tail` still holds at least tail_cap + len(suffix) bytes
            if self.suffix and tail.endswith(self.suffix):
                tail, total, seen = tail[: -len(self.suffix)], total - len(self.suffix), True
            tail = tail[len(tail) - tail_cap:]
            omitted = total - len(head) - len(tail)
        return truncation_text(_decode(head), omitted, _decode(tail)), True, seen


def truncation_text(head: str, omitted: int, tail: str) -> str:
    return f"{head}\n[... output truncated: {omitted} bytes omitted ...]\n{tail}"


def timeout_marker(timeout_s: float) -> str:
    return f"\n[... command timed out after {timeout_s:g} s and was killed ...]\n"


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
