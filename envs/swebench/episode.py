"""One SWE-bench episode in the agent's container: its state, its first messages, and each turn's tool
calls run there. An agent's mistake (an unknown tool, bad arguments, a failed edit) becomes an
observation; a container that fails ends the turn with a ``failure``, and the episode with it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sao.sandboxes import SandboxClosedError, SandboxError

from ..core import Message
from sao.hints import did_you_mean
from .images import ResolvedImage
from .instances import SWEInstance
from .tools import NO_TOOL_CALL, TOOLS, USER_TEMPLATE, ToolError, Workspace, _arguments


@dataclass
class Episode:
    """The state of the current episode."""

    baseline: str  # what the agent's diff is taken against (a commit, or a tree snapshot)
    image: ResolvedImage
    timing: dict[str, float]  # seconds: reset_s (image + container_start_s + workspace_s), tools_s, ...
    steps: int = 0
    format_errors: int = 0  # consecutive turns without a usable tool call


@dataclass(frozen=True)
class Turn:
    """What one reply's tool calls came to."""

    observations: list[Message]
    usable: bool  # at least one tool call did something (a format error otherwise)
    submitted: bool
    failure: str | None  # the agent's container failed: the episode ends, ungraded


def first_messages(system_prompt: str | None, inst: SWEInstance) -> list[Message]:
    messages: list[Message] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": USER_TEMPLATE.format(
        problem_statement=inst.problem_statement.strip(), repo=inst.repo)})
    return messages


def run_tool_calls(workspace: Workspace, action: Message, timing: dict[str, float]) -> Turn:
    """Run the reply's tool calls in order, adding their time to ``timing["tools_s"]``; the calls after a
    ``submit`` or a container failure are answered, not run."""
    obs: list[Message] = []
    invalid = action.get("invalid_tool_calls") or []
    calls = action.get("tool_calls") or []
    for problem in invalid:
        obs.append({"role": "user", "content": f"A tool call in your reply could not be parsed: {problem}. "
                                               "Repeat it as a well-formed tool call."})
    usable, submitted, failure = False, False, None
    for call in calls:
        call_id = str(call.get("id") or "")
        if submitted or failure:
            obs.append(tool_message(call_id, "Not run: the episode has ended."))
            continue
        called = time.monotonic()
        try:
            content, ok, submitted = call_tool(workspace, call)
            usable = usable or ok
        except SandboxError as exc:
            failure = f"the agent's container failed: {exc}"
            content = f"Error: {failure}"
        finally:
            timing["tools_s"] += time.monotonic() - called
        obs.append(tool_message(call_id, content))
    if not calls and not invalid:
        obs.append({"role": "user", "content": NO_TOOL_CALL})
    return Turn(obs, usable, submitted, failure)


def call_tool(workspace: Workspace, call: Mapping[str, Any]) -> tuple[str, bool, bool]:
    """``(observation, usable, submitted)`` for one tool call; agent mistakes become observations."""
    name = call["function"]["name"]
    tool = next((t for t in TOOLS if t["function"]["name"] == name), None)
    if tool is None:
        known = [t["function"]["name"] for t in TOOLS]
        return (f"Error: unknown tool {name!r}.{did_you_mean(name, known)} Available tools: "
                f"{', '.join(known)}.", False, False)
    try:
        args = _arguments(call, tool)
    except ToolError as exc:
        return f"Error: {exc}", False, False
    if name == "submit":
        return "Submitted. Your changes will be graded by the project's tests.", True, True
    try:
        if name == "bash":
            return workspace.bash(args["command"]), True, False
        return workspace.editor(**args), True, False
    except ToolError as exc:
        return f"Error: {exc}", True, False
    except SandboxClosedError:
        raise
    except SandboxError as exc:
        # A file operation the container refused (a directory as a file, a device, ...) is the
        # agent's mistake as long as the container still answers.
        workspace.sb.run("true", timeout_s=30)
        return f"Error: {exc}", True, False


def tool_message(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}
