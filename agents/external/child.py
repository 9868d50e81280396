"""The subprocess side of an external agent: ``python -m sao.agents.external.child JOB RESULT``.

It reads a :class:`~.wire.Job` (JSON, from the file ``JOB``, or stdin when ``JOB`` is ``-``), imports the
plug-in's ``module:callable``, calls it with the task and the endpoint (a coroutine function runs
through :func:`asyncio.run`), and writes the outcome to the file ``RESULT`` (:mod:`.wire`): not to
stdout, where agents print. What the agent raises (``sys.exit`` included) is written as a
:class:`~.wire.ChildError` with the type, the message and the traceback's tail; the exit status is 0
for a result, 1 for an error, 2 for a bad command line. The file is written whole or not at all (a
rename), so that a child killed mid-write leaves no torn outcome.

The runner (:mod:`.process`) starts it in a session of its own, so that on a timeout the whole process
group, with whatever the agent spawned, is killed.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import traceback
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

from .task import AgentEndpoint, AgentResult, AgentTask
from .wire import ChildError, as_result, error_to_json, job_from_json, result_to_json

TRACEBACK_CHARS = 4000  # the tail of an agent's traceback kept in its outcome


def load_target(target: str) -> Any:
    """The object an entry point's value ``module:attr`` names (``module:a.b`` for a nested one)."""
    return EntryPoint(name="agent", value=target, group="sao.agents").load()


def call(agent: Any, task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    """``agent(task, endpoint)``, awaited when it is a coroutine function (or returns an awaitable)."""
    value = agent(task, endpoint)
    if inspect.isawaitable(value):
        value = asyncio.run(_awaited(value))
    return as_result(value)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def error_of(exc: BaseException) -> ChildError:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ChildError(type(exc).__name__, str(exc), text[-TRACEBACK_CHARS:])


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run(job_text: str) -> tuple[bool, str]:
    """Run the job; whether the agent gave a result, and the outcome's JSON."""
    try:
        job = job_from_json(job_text)
        agent = load_target(job.target)
        return True, result_to_json(call(agent, job.task, job.endpoint))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the agent raised is its outcome
        return False, error_to_json(error_of(exc))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sao.agents.external.child JOB.json|- RESULT.json", file=sys.stderr)
        return 2
    job_text = sys.stdin.read() if args[0] == "-" else Path(args[0]).read_text()
    ok, outcome = run(job_text)
    write_atomically(Path(args[1]), outcome)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
