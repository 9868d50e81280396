"""What an external agent is given and what it gives back: the records at the boundary between ``sao`` and
an agent from another package (mini-swe-agent, the OpenAI Agents SDK, a user's own), which runs one task
in its own subprocess against an OpenAI-compatible base URL (the capture proxy's session).

An agent plug-in is a callable ``(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult`` (or a
coroutine function of the same), registered under the ``sao.agents`` entry-point group. The environment
grades what it returns with its own grader (a patch in a fresh container for SWE, an answer for math).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sao.envs.core import Message

ENTRY_POINT_GROUP = "sao.agents"
"""Entry-point group of agent plug-ins: ``name = "package.module:callable"``."""
BUILTIN_AGENTS = ("llm", "gold", "empty")
"""Names the project's own players take; a plug-in may not use them."""


@dataclass(frozen=True)
class AgentEndpoint:
    """Where the agent sends its chat completions: an OpenAI-compatible ``base_url`` (ending in ``/v1``),
    the model name to ask for, and an API key (the proxy accepts any)."""

    base_url: str
    model: str
    api_key: str = "EMPTY"


@dataclass(frozen=True)
class SandboxRules:
    """The project's sandbox rules for containers an agent starts itself (mini-swe-agent's ``docker run``):
    no network unless ``network``, CPU and memory limits, and ``labels`` that the orphan reaper and the
    episode's clean-up find them by."""

    network: bool = False
    cpus: float = 2.0
    memory_mb: int = 4096
    pids: int = 512
    labels: dict[str, str] = field(default_factory=dict)

    def docker_run_args(self) -> list[str]:
        """These rules as ``docker run`` arguments, hardened as the project's own sandboxes are: no added
        capabilities, no privilege gain, no swap beyond the memory limit, an init process that reaps."""
        args = [] if self.network else ["--network", "none"]
        args += ["--cpus", f"{self.cpus:g}", "--memory", f"{self.memory_mb}m", "--memory-swap", f"{self.memory_mb}m",
                 "--pids-limit", str(self.pids), "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--init"]
        for key, value in sorted(self.labels.items()):
            args += ["--label", f"{key}={value}"]
        return args


@dataclass(frozen=True)
class AgentTask:
    """One task for an external agent.

    env, task_id, episode_id: which environment, task and episode (the episode id names its containers).
    prompt:     the task as the environment states it to a model (its first user message's text).
    messages:   the environment's opening messages (system and user), for an agent that takes them whole.
    tools:      the tools the environment offers a model (OpenAI function schemas); an agent may use its own.
    image:      SWE: the instance's container image; None elsewhere.
    repo_path:  SWE: the repository's path inside that image (``/testbed``); None elsewhere.
    sandbox:    the rules for any container the agent starts.
    step_limit: the most model calls the agent should make (None: its own default).
    timeout_s:  the wall time the agent's subprocess gets before it is killed.
    extra:      anything else the environment states about the task (JSON-able).
    seed:       the episode's sampling seed, for an agent that seeds its requests (None: unseeded).
    """

    env: str
    task_id: str
    episode_id: str
    prompt: str
    messages: tuple[Message, ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    image: str | None = None
    repo_path: str | None = None
    sandbox: SandboxRules = field(default_factory=SandboxRules)
    step_limit: int | None = None
    timeout_s: float = 3600.0
    extra: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None


@dataclass(frozen=True)
class AgentResult:
    """What the agent gives the environment to grade: an ``answer`` (math) or a ``patch`` (SWE, a unified
    diff against the repository; "" for none), how many ``steps`` it took, and its own ``info`` (exit
    status, cost, ...; JSON-able)."""

    answer: str | None = None
    patch: str | None = None
    steps: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
