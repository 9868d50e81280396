"""Scripted agent plug-ins for tests: each is a ``(task, endpoint) -> AgentResult`` that an
:class:`~sao.agents.external.runner.ExternalAgentRunner` runs in its subprocess (so they must be
importable by name: ``sao.agents.testing.fake_agents:gold``). Each does one thing:

* :func:`gold` answers the arithmetic task right (it computes it from the prompt); :func:`gold_async`
  too, as a coroutine function; :func:`loud` prints to stdout and stderr first; :func:`wrong` answers
  wrong; :func:`silent` returns no answer.
* :func:`crash` raises; :func:`hang` starts a child process, writes its pid to ``spawned.pid`` in its
  working folder, and sleeps; :func:`hang_in_container` starts a container under the task's sandbox
  rules (``docker run -d``, its id in ``container.id``, ``docker inspect`` in ``container.json``) and sleeps.
* :func:`ask_model` asks the endpoint with the plain ``openai`` SDK (temperature 0, the task's seed) and
  answers what it said.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

from ..external.task import AgentEndpoint, AgentResult, AgentTask

_PROBLEM = re.compile(r"What is (-?\d+) ([-+*/]) (-?\d+)\?")


def solve(prompt: str) -> int:
    """The answer to an arithmetic task's question."""
    m = _PROBLEM.search(prompt)
    if m is None:
        raise ValueError(f"not an arithmetic question: {prompt[:80]!r}")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]


def gold(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    return AgentResult(answer=f"\\boxed{{{solve(task.prompt)}}}", steps=0, info={"by": "gold"})


async def gold_async(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    await asyncio.sleep(0)
    return AgentResult(answer=str(solve(task.prompt)), steps=0)


def loud(task: AgentTask, endpoint: AgentEndpoint) -> dict:
    print('{"ok": false} printed on stdout, not a result')
    print("and some noise on stderr", file=sys.stderr)
    return {"answer": str(solve(task.prompt)), "info": {"by": "loud"}}


def wrong(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    return AgentResult(answer=str(solve(task.prompt) + 1))


def silent(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    return AgentResult(answer=None)


def crash(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    raise RuntimeError(f"the agent broke on {task.task_id}")


def hang(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    Path("spawned.pid").write_text(str(child.pid))
    time.sleep(3600)
    return AgentResult(answer="too late")


def hang_in_container(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    image = task.image or str(task.extra.get("image") or "sao-base:bookworm-v1")
    run = subprocess.run(["docker", "run", "-d", *task.sandbox.docker_run_args(), image, "sleep", "3600"],
                         capture_output=True, text=True, check=True)
    Path("container.id").write_text(run.stdout.strip())
    inspected = subprocess.run(["docker", "inspect", run.stdout.strip()], capture_output=True, text=True, check=True)
    Path("container.json").write_text(inspected.stdout)
    time.sleep(3600)
    return AgentResult(patch="too late")


def ask_model(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    from openai import OpenAI

    client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    reply = client.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": task.prompt}],
                                           temperature=0.0, seed=task.seed, max_tokens=64)
    return AgentResult(answer=reply.choices[0].message.content, steps=1)
