"""Errors raised at the sandbox boundary.

Error model:

* **A command's own failure is data, not an error.** ``Sandbox.run`` returns an
  :class:`~sao.sandboxes.base.ExecResult` for every command that was started: a non-zero exit,
  a crash, an out-of-memory kill (exit 137) or a fork limit hit are all results. A command
  that runs past its time limit is killed with its whole process tree and comes back as a
  result with ``timed_out=True``, ``exit_code=124`` and a marker line at the end of the output;
  there is no timeout exception. The agent sees these as observations.
* **The sandbox itself failing is an error**, a subclass of :class:`SandboxError`:

  - :class:`SandboxStartError`: the sandbox could not be created (missing image, bad limits,
    ``docker create``/``start`` refused, ``bwrap`` demanded but unusable).
  - :class:`DockerUnavailableError`: the Docker daemon does not answer; the message says how to
    start it. Subclass of :class:`SandboxStartError` (nothing can start without a daemon).
  - :class:`SandboxClosedError`: ``run`` or a file operation on a sandbox that was closed, or
    whose container has gone away (removed by ``gc``, killed by the daemon).
  - :class:`SandboxPathError` (also a ``ValueError``): a path that leaves the sandbox root
    (``..`` or a symlink pointing out), for sandboxes that have a root (``LocalSandbox``).
  - :class:`SandboxError` itself: any other failure of the machinery (a Docker API error in the
    middle of a command, an archive that cannot be read).

* **File operations use the built-in errors** for the ordinary cases callers already handle:
  ``FileNotFoundError`` for a missing path, ``IsADirectoryError`` for reading a directory,
  ``NotADirectoryError`` for listing a file.

An environment that runs agent code should catch :class:`SandboxError` around an episode and
record the episode as failed with its cause ("a bad rollout is data"); a
:class:`DockerUnavailableError` at start-up is a set-up problem and should stop the run.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of this package's errors: the sandbox machinery (not the command) failed."""


class SandboxStartError(SandboxError):
    """A sandbox could not be created or started."""


class DockerUnavailableError(SandboxStartError):
    """The Docker daemon does not answer (not installed, not running, or no permission on its socket)."""

    HINT = (
        "Start the daemon as root with `nohup dockerd >/var/log/dockerd.log 2>&1 &` "
        "(Debian: `apt-get install -y docker.io`), wait until `docker info` works, "
        "or point DOCKER_HOST at a running daemon."
    )

    def __init__(self, cause: object = None):
        detail = f" ({cause})" if cause is not None else ""
        super().__init__(f"the Docker daemon does not answer{detail}. {self.HINT}")
        self.cause = cause


class SandboxClosedError(SandboxError):
    """The sandbox was closed (or its container is gone); it cannot run commands or touch files."""


class SandboxPathError(SandboxError, ValueError):
    """A path that resolves outside the sandbox root."""
