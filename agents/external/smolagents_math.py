"""smolagents (PyPI ``smolagents[openai]``, extra ``agents-smolagents``), unchanged, as the ``sao.agents``
plug-in ``smolagents``: its ``ToolCallingAgent`` on a math task, with one tool of ours, ``python``, whose
code runs in the project's sandbox (:class:`~sao.envs.python_tool.PythonTool`, the math environments' own
tool), never in the agent's process. It returns the agent's final answer as the answer to grade.

- **Model:** ``OpenAIModel(model_id=endpoint.model, api_base=endpoint.base_url, api_key=endpoint.api_key)``,
  the plain ``openai`` client. smolagents asks for ``tool_choice="required"`` and its own ``final_answer``
  tool ends the run.
- **Sandbox:** ``task.extra["tool_sandbox"]`` (``"local"``, the default, or ``"docker"``), as the math
  environments' ``sandbox=`` option; the sandbox is removed when the run ends, however it ends.
- **Limits:** at its step limit smolagents makes one more call, without tools, for a final answer; so
  ``max_steps`` is ``task.step_limit - 1`` (at least 1) and the calls stay within ``task.step_limit``
  (smolagents' 20 steps when it is None).
- **Quiet:** ``verbosity_level=LogLevel.OFF`` (it prints rich panels to stdout otherwise). smolagents sends
  no telemetry; it imports ``huggingface_hub`` but calls no hub here.

A step whose tool call fails to parse or to run is recorded by the agent and it goes on (its ``errors``
are listed in ``info``); a failed model call (``AgentGenerationError``) ends the run with that exception,
which the runner records as the episode's cause.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sao.envs.python_tool import PYTHON_TOOL, PythonTool

from .task import AgentEndpoint, AgentResult, AgentTask

NAME = "smolagents"


def run(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    """The ``sao.agents`` plug-in: smolagents' tool-calling agent on one math task (module docstring)."""
    with PythonTool(task.extra.get("tool_sandbox", "local")) as tool:
        return solve(task, endpoint, tool)


def solve(task: AgentTask, endpoint: AgentEndpoint, tool: PythonTool) -> AgentResult:
    """Run the agent on ``task.prompt`` with ``tool`` as its ``python`` tool (the caller closes the tool)."""
    try:
        import smolagents
    except ImportError as exc:
        raise ImportError(f"{NAME} needs the extra agents-smolagents: pip install -e '.[agents-smolagents]' ({exc})") from exc
    from smolagents import ActionStep, LogLevel, OpenAIModel, ToolCallingAgent

    model = OpenAIModel(model_id=endpoint.model, api_base=endpoint.base_url, api_key=endpoint.api_key)
    max_steps = 20 if task.step_limit is None else max(1, task.step_limit - 1)
    agent = ToolCallingAgent(tools=[sandboxed_python(tool)], model=model, max_steps=max_steps,
                             verbosity_level=LogLevel.OFF)
    result = agent.run(task.prompt, return_full_result=True)
    steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
    calls = Counter(call.name for s in steps for call in s.tool_calls or ())
    info = {"agent": NAME, "agent_version": smolagents.__version__, "state": result.state,
            "tool_calls": dict(sorted(calls.items())),
            "errors": [f"{type(s.error).__name__}: {s.error}" for s in steps if s.error is not None]}
    answer = None if result.output is None else str(result.output)
    return AgentResult(answer=answer, steps=len(steps), info=info)


def sandboxed_python(tool: PythonTool) -> Any:
    """A smolagents ``Tool`` named ``python`` whose ``forward`` hands the code to ``tool``'s sandbox."""
    from smolagents import Tool

    class SandboxedPython(Tool):
        name = "python"
        description = PYTHON_TOOL["function"]["description"]
        inputs = {"code": {"type": "string", "description": "the program"}}
        output_type = "string"

        def forward(self, code: str) -> str:
            return tool.run(code)

    return SandboxedPython()
