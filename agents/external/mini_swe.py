"""mini-swe-agent (PyPI ``mini-swe-agent``, extra ``agents-mini-swe``), unchanged, as the ``sao.agents``
plug-in ``mini-swe-agent``: a thin adapter that builds the agent through its own Python API, the way its
SWE-bench run scripts do (``minisweagent.run.benchmarks.swebench``), and returns its submission as the
patch.

What the adapter sets, and why:

- **Config:** the package's own SWE-bench config (``config/benchmarks/swebench.yaml``: its prompts, tool-call
  format and submission protocol), with the task's values merged over it.
- **Model:** its ``LitellmModel`` with ``model_name="openai/<endpoint.model>"`` (litellm's prefix for any
  OpenAI-compatible server), ``api_base=endpoint.base_url`` and ``api_key=endpoint.api_key``.
- **Offline litellm:** ``LITELLM_LOCAL_MODEL_COST_MAP=True`` before litellm is imported, so that it reads
  its bundled price table instead of fetching one from GitHub at import (offline that fetch fails, retries
  and then falls back). A model litellm does not know has no price, and mini-swe-agent's default cost
  tracking then raises on the first call: ``cost_tracking="ignore_errors"`` counts it as 0, and the cost
  limit is off (``cost_limit=0``); the step limit and the wall time bound the run.
- **Environment:** its own ``DockerEnvironment`` (``docker run`` of ``task.image``, cwd ``task.repo_path``)
  with ``run_args = ["--rm", *task.sandbox.docker_run_args()]``: no network, the CPU, memory and pids
  limits, and the labels the episode's clean-up and the orphan reaper find it by. Its container sleeps
  ``task.timeout_s`` plus a minute, not its default two hours, so one orphaned by a SIGKILL ends by itself.
  mini-swe-agent stops its container in the background (``docker stop`` from ``__del__``); the adapter
  removes it synchronously (``docker rm -f``) before it returns or raises.
- **Limits:** ``step_limit`` is ``task.step_limit`` (its config's 250 when None); the agent stops itself
  after nine tenths of ``task.timeout_s`` (``wall_time_limit_seconds``), before the runner's kill.
- **Quiet and private:** ``MSWEA_SILENT_STARTUP`` (no banner on stdout) and ``MSWEA_GLOBAL_CONFIG_DIR`` in
  the temporary directory (a user's ``~/.config/mini-swe-agent/.env`` is not read), litellm's
  ``suppress_debug_info`` (its failed price look-up prints a banner per call); a model call is tried 3
  times (``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT``; its default 10, with waits of up to a minute, would
  spend the episode's time on a dead endpoint). These are environment variables, set (if unset) in the
  agent's own subprocess (``suppress_debug_info`` is litellm's module setting).

The issue text is ``task.extra["problem_statement"]`` when the environment gives it (the SWE
environments' prompt names their own tools, which mini-swe-agent does not have), else ``task.prompt``.
Before the agent starts, ``task.extra["setup_command"]`` (when given) runs in its container: the SWE
environments prepare the repository as in their own episodes, the commits after the base hidden (a line
in the episode's ``agent.log`` and ``setup_command_ran`` in the result's info say it did).
mini-swe-agent's Python API is synchronous; the runner's subprocess timeout is what bounds a hung call.
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .task import AgentEndpoint, AgentResult, AgentTask

NAME = "mini-swe-agent"
DEFAULT_REPO_PATH = "/testbed"
OFFLINE_ENVIRONMENT = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_GLOBAL_CONFIG_DIR": str(Path(tempfile.gettempdir()) / "sao-mini-swe-agent"),
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
}
"""Environment variables set (where unset) before mini-swe-agent and litellm are imported (module docstring)."""


def run(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    """The ``sao.agents`` plug-in: mini-swe-agent on one SWE task (module docstring)."""
    return solve(task, endpoint)


def solve(task: AgentTask, endpoint: AgentEndpoint, *, docker: str = "docker") -> AgentResult:
    """Run mini-swe-agent on ``task`` against ``endpoint``; ``docker`` is the container CLI it calls (tests
    pass a stand-in). Its container is removed before this returns or raises."""
    if not task.image:
        raise ValueError(f"{NAME} needs a container image (a SWE task); task {task.task_id!r} of {task.env!r} "
                         "has none")
    for key, value in OFFLINE_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    try:
        import litellm
        import minisweagent
    except ImportError as exc:
        raise ImportError(f"{NAME} needs the extra agents-mini-swe: pip install -e '.[agents-mini-swe]' ({exc})") from exc
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments import get_environment
    from minisweagent.models import get_model

    litellm.suppress_debug_info = True  # else its cost look-up of an unknown model prints a banner per call
    config = agent_config(task, endpoint, docker=docker)
    env = get_environment(config["environment"])
    try:
        prepared = prepare(env, task)
        agent = DefaultAgent(get_model(config=config["model"]), env, **config["agent"])
        info = agent.run(problem_statement(task))
    finally:
        removed = remove_container(env)
    return AgentResult(patch=info.get("submission") or "", steps=agent.n_calls,
                       info={"exit_status": info.get("exit_status"), "agent": NAME,
                             "agent_version": minisweagent.__version__, "container_removed": removed,
                             "setup_command_ran": prepared})


def agent_config(task: AgentTask, endpoint: AgentEndpoint, *, docker: str = "docker") -> dict[str, Any]:
    """mini-swe-agent's SWE-bench config with the task's image, limits and endpoint merged over it."""
    from minisweagent.config import builtin_config_dir, get_config_from_spec
    from minisweagent.utils.serialize import recursive_merge

    base = get_config_from_spec(builtin_config_dir / "benchmarks" / "swebench.yaml")
    agent: dict[str, Any] = {"cost_limit": 0, "wall_time_limit_seconds": max(1, int(task.timeout_s * 0.9))}
    if task.step_limit is not None:
        agent["step_limit"] = task.step_limit
    ours = {
        "agent": agent,
        "environment": {
            "environment_class": "docker",
            "executable": docker,
            "image": task.image,
            "cwd": task.repo_path or DEFAULT_REPO_PATH,
            "run_args": ["--rm", *task.sandbox.docker_run_args()],
            "container_timeout": f"{math.ceil(task.timeout_s) + 60}s",
        },
        "model": {
            "model_class": "litellm",
            "model_name": f"openai/{endpoint.model}",
            "cost_tracking": "ignore_errors",
            "model_kwargs": {"api_base": endpoint.base_url, "api_key": endpoint.api_key},
        },
    }
    return recursive_merge(base, ours)


def prepare(env: Any, task: AgentTask) -> bool:
    """Run the environment's ``setup_command`` in the agent's container before the agent starts (the SWE
    environments' brief: the repository prepared as in their own episodes, later commits hidden); whether
    there was one. A line on stdout (the episode's ``agent.log``) says that it ran."""
    command = task.extra.get("setup_command")
    if not command:
        return False
    done = env.execute({"command": command}, timeout=600)
    if done.get("returncode") != 0:
        raise RuntimeError(f"preparing the repository in the agent's container failed (exit {done.get('returncode')}): "
                           f"{str(done.get('output', ''))[-800:]}")
    print(f"{NAME}: the task's setup_command ran in the agent's container (exit 0)", flush=True)
    return True


def problem_statement(task: AgentTask) -> str:
    """The issue as the agent's template expects it (module docstring)."""
    return str(task.extra.get("problem_statement") or task.prompt)


def remove_container(env: Any) -> bool:
    """Remove mini-swe-agent's container now (``docker rm -f``), and tell its ``__del__`` there is nothing
    left to stop; whether the removal succeeded (True when none was started)."""
    container = getattr(env, "container_id", None)
    if not container:
        return True
    try:
        done = subprocess.run([env.config.executable, "rm", "-f", container], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    env.container_id = None
    return done.returncode == 0
