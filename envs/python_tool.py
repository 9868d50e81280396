"""The ``python`` tool: a program runs in a fresh process of a sandbox, and what it prints comes back as text.

One copy of the tool for everyone who offers it: the math environments' ``tools="python"``
(:class:`~sao.envs.math_envs.MathEnv`) and the external agents on math tasks (the smolagents adapter,
:mod:`sao.agents.external.smolagents_math`), whose tool must run the code in the project's sandbox rather
than in the agent's own process.

``sandbox="local"`` is a :class:`~sao.sandboxes.LocalSandbox` (bubblewrap-isolated, no network; where
bubblewrap is not usable it refuses to start unless ``SAO_SANDBOX_UNISOLATED=1``), ``"docker"`` a :class:`~sao.sandboxes.DockerSandbox` on the base image
(no network). The sandbox is started on the first call and kept until :meth:`PythonTool.close`; each call is a new ``python3``
process, so nothing but files persists between calls. A timeout, a non-zero exit status or an empty output
is said in the text; nothing raises for what the program does.
"""

from __future__ import annotations

from typing import Any

from sao.sandboxes import BASE_IMAGE, DockerSandbox, LocalSandbox, Sandbox, SandboxLimits

PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python 3 program and return what it prints (stdout and stderr). Nothing persists "
                       "between calls: print every result you need.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the program"}},
                       "required": ["code"]},
    },
}
"""The tool's OpenAI function schema."""
SANDBOXES = ("local", "docker")


class PythonTool:
    """Runs Python programs in one sandbox of kind ``sandbox`` (module docstring), started on first use."""

    def __init__(self, sandbox: str = "local", *, timeout_s: float = 10.0, output_chars: int = 4000):
        if sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {SANDBOXES}, got {sandbox!r}")
        self.sandbox_kind = sandbox
        self.limits = SandboxLimits(cpus=1.0, memory_mb=1024, pids=64, network=False,
                                    output_limit_bytes=output_chars, default_timeout_s=timeout_s)
        self._sandbox: Sandbox | None = None

    @property
    def started(self) -> bool:
        """Whether a sandbox is up (between the first :meth:`run` and :meth:`close`)."""
        return self._sandbox is not None

    def run(self, code: str) -> str:
        """Run ``code`` as a program; its output (truncated to the limit), with ``[exit status N]`` appended
        when it failed, the sandbox's timeout marker when it ran too long, ``[no output]`` when silent."""
        if self._sandbox is None:
            self._sandbox = (DockerSandbox(BASE_IMAGE, limits=self.limits) if self.sandbox_kind == "docker"
                             else LocalSandbox(self.limits))
        path = "/tmp/main.py" if self.sandbox_kind == "docker" else "main.py"  # LocalSandbox: relative to its root
        self._sandbox.write_file(path, code)
        result = self._sandbox.run(f"python3 {path}")  # a timeout is reported inside the output
        text = result.output
        if result.exit_code != 0 and not result.timed_out:
            text += f"\n[exit status {result.exit_code}]"
        return text if text.strip() else "[no output]"

    def close(self) -> None:
        """Remove the sandbox (idempotent); a later :meth:`run` starts a fresh one."""
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            sandbox.close()

    def __enter__(self) -> PythonTool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
