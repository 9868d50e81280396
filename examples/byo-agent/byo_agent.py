"""An agent written with the plain ``openai`` SDK, registered as a ``sao.agents`` plug-in (pyproject.toml).

sao runs it unchanged, one task per subprocess, pointed at a capture-proxy session: ``sao-eval`` scores it,
``sao-train`` trains the model behind it on the exact tokens the engine sampled."""

from openai import OpenAI

from sao.agents.external.task import AgentEndpoint, AgentResult, AgentTask

SYSTEM = "Solve the problem. End with the final answer in \\boxed{}."


def run(task: AgentTask, endpoint: AgentEndpoint) -> AgentResult:
    client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt}]
    text, steps = "", 0
    for steps in range(1, (task.step_limit or 3) + 1):
        reply = client.chat.completions.create(model=endpoint.model, messages=messages, max_tokens=256,
                                               temperature=0.7)  # training pins the run's settings instead
        text = reply.choices[0].message.content or ""
        if "\\boxed{" in text:
            break
        # no answer yet: ask again, keeping the history (the calls then merge into one trajectory)
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "Give the final answer in \\boxed{}."}]
    return AgentResult(answer=text, steps=steps)
