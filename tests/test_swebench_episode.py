"""envs/swebench/episode.py on a scripted sandbox: a turn's tool calls, what becomes an observation and what
ends the episode (the same rules the Docker tests of tests/test_swebench_env.py check end to end)."""

from __future__ import annotations

import json
from typing import Any

from sao.envs.swebench.episode import call_tool, run_tool_calls
from sao.envs.swebench.tools import NO_TOOL_CALL, Workspace
from sao.sandboxes import ExecResult, FakeSandbox, SandboxClosedError


def call(name: str, call_id: str = "c1", **args: Any) -> dict[str, Any]:
    return {"id": call_id, "function": {"name": name, "arguments": json.dumps(args)}}


def workspace(answer: Any = "out\n") -> Workspace:
    def script(command: str) -> ExecResult | str:
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return Workspace(FakeSandbox(script), command_timeout_s=5, observation_chars=1000)


def test_agent_mistakes_are_observations_and_only_working_calls_are_usable():
    ws = workspace()
    text, usable, submitted = call_tool(ws, call("bsh", command="ls"))
    assert text.startswith("Error: unknown tool 'bsh'.") and "'bash'?" in text  # the closest name suggested
    assert text.endswith(" Available tools: bash, editor, submit.") and not usable and not submitted
    text, usable, submitted = call_tool(ws, call("bash", cmd="ls"))
    assert text.startswith("Error: unknown argument(s) ['cmd']") and not usable and not submitted
    assert call_tool(ws, call("bash", command="ls")) == ("[exit code 0]\nout\n", True, False)
    assert call_tool(ws, call("submit"))[1:] == (True, True)
    assert ws.sb.commands and all(c.startswith("bash -c ") for c in ws.sb.commands)  # the instance's shell


def test_a_turn_answers_every_call_and_stops_running_them_at_submit():
    timing = {"tools_s": 0.0}
    turn = run_tool_calls(workspace(), {"tool_calls": [call("bash", "a", command="ls"), call("submit", "b"),
                                                       call("bash", "c", command="rm -rf /")],
                                        "invalid_tool_calls": ["not JSON"]}, timing)
    assert (turn.usable, turn.submitted, turn.failure) == (True, True, None)
    assert [m["role"] for m in turn.observations] == ["user", "tool", "tool", "tool"]
    assert "could not be parsed: not JSON" in turn.observations[0]["content"]
    assert [m.get("tool_call_id") for m in turn.observations[1:]] == ["a", "b", "c"]
    assert turn.observations[3]["content"] == "Not run: the episode has ended."
    assert timing["tools_s"] > 0.0


def test_no_tool_call_is_a_format_error_and_a_dead_container_ends_the_turn():
    empty = run_tool_calls(workspace(), {"content": "I think..."}, {"tools_s": 0.0})
    assert empty.observations == [{"role": "user", "content": NO_TOOL_CALL}] and not empty.usable
    dead = run_tool_calls(workspace(SandboxClosedError("sandbox x is closed")),
                          {"tool_calls": [call("bash", "a", command="ls"), call("bash", "b", command="ls")]},
                          {"tools_s": 0.0})
    assert dead.failure == "the agent's container failed: sandbox x is closed" and not dead.submitted
    assert dead.observations[0]["content"] == "Error: the agent's container failed: sandbox x is closed"
    assert dead.observations[1]["content"] == "Not run: the episode has ended."
