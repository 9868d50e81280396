"""One agent subprocess, start to end: :func:`run_child` writes the job, starts
``python -m sao.agents.external.child`` in a session of its own (its own process group), waits for it
at most the timeout, and then kills the whole group, whatever happened: a hung agent with everything
it spawned on a timeout, a background process the agent left on a normal exit, all of them when the
caller is cancelled. The agent's stdout and stderr go to ``agent.log`` in the work folder; their tail
comes back in the :class:`ChildRun`.

Containers are not processes of the group (the Docker daemon runs them): :mod:`.containers` removes
those by their labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .task import AgentResult
from .wire import ChildError, Job, job_to_json, outcome_from_json

LOG_TAIL_CHARS = 2000  # the tail of the agent's output kept with its run


@dataclass(frozen=True)
class ChildRun:
    """How an agent's subprocess ended.

    outcome:    what it wrote (:mod:`.wire`): the agent's result, the error it raised, or None when it
                wrote nothing readable (killed on a timeout, crashed, or wrote a torn file: ``problem``).
    timed_out:  it ran past its timeout and was killed, with its process group.
    returncode: the child's exit status (negative: the signal that ended it).
    wall_s:     seconds from its start to its end.
    log_tail:   the last characters of what it printed (stdout and stderr).
    problem:    why there is no outcome, when it ended by itself without one.
    """

    outcome: AgentResult | ChildError | None
    timed_out: bool
    returncode: int | None
    wall_s: float
    log_tail: str = ""
    problem: str | None = None


async def run_child(job: Job, workdir: Path, *, timeout_s: float, python: str = sys.executable) -> ChildRun:
    """Run ``job`` in a subprocess of its own session under ``workdir`` (module doc)."""
    job_path, result_path, log_path = workdir / "job.json", workdir / "result.json", workdir / "agent.log"
    job_path.write_text(job_to_json(job))
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            python, "-m", "sao.agents.external.child", str(job_path), str(result_path),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir)
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        kill_group(proc.pid)
        await proc.wait()
    wall_s = time.monotonic() - started
    outcome, problem = None, None
    if not timed_out:
        outcome, problem = read_outcome(result_path, proc.returncode)
    return ChildRun(outcome, timed_out, proc.returncode, wall_s, tail(log_path), problem)


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group ``pgid`` (none left: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def read_outcome(path: Path, returncode: int | None) -> tuple[AgentResult | ChildError | None, str | None]:
    """The outcome the child wrote, or None and why there is none."""
    if not path.is_file():
        return None, f"the agent's process exited with status {returncode} and wrote no result"
    try:
        return outcome_from_json(path.read_text()), None
    except (ValueError, TypeError, KeyError) as exc:
        return None, f"the agent's result file cannot be read ({type(exc).__name__}: {exc})"


def tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4 * chars))
            return f.read().decode("utf-8", errors="replace")[-chars:]
    except OSError:
        return ""
