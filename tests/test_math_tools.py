"""Math with a Python tool: tool calls run in a sandbox; errors and timeouts become observations."""

from __future__ import annotations

import json

import pytest

import sao.envs as E
from sao.agents import ChatRenderer, Completion
from sao.envs.arithmetic import make_task


def call(code, cid="c1", name="python"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps({"code": code})}}


def act(*calls, invalid=()):
    msg = {"role": "assistant", "content": "let me compute", "tool_calls": list(calls)}
    if invalid:
        msg["invalid_tool_calls"] = list(invalid)
    return msg


def _episode(env, task_id="mul-d3-s0-i1"):
    obs, _ = env.reset(options={"task_id": task_id})
    return make_task("mul", 3, 0, 1)


def test_python_tool_runs_and_the_answer_is_graded():
    env = E.make("arithmetic", tools="python", tool_timeout_s=3)
    assert env.unwrapped.tools[0]["function"]["name"] == "python"
    task = _episode(env)
    a, b = task.problem.removeprefix("What is ").removesuffix("?").split(" * ")
    obs, reward, terminated, truncated, _ = env.step(act(call(f"print({a}*{b})")))
    assert not terminated and reward == 0.0
    assert obs == [{"role": "tool", "tool_call_id": "c1", "name": "python", "content": f"{int(a) * int(b)}\n"}]
    obs, reward, terminated, _, info = env.step(f"\\boxed{{{obs[0]['content'].strip()}}}")
    assert terminated and reward == 1.0 and info["correct"]
    env.close()


def test_tool_errors_timeouts_and_malformed_calls_are_observations():
    env = E.make("arithmetic", tools="python", tool_timeout_s=2)
    _episode(env)
    obs, *_ = env.step(act(call("raise SystemExit(3)"), call("1/0", "c2"), call("x", "c3", name="bash"),
                           invalid=["tool call 1 is not valid JSON"]))
    contents = [m["content"] for m in obs]
    assert contents[0] == "Error: tool call 1 is not valid JSON"
    assert contents[1].endswith("[exit status 3]")
    assert "ZeroDivisionError" in contents[2] and "[exit status 1]" in contents[2]
    assert "unknown tool 'bash'" in contents[3]
    obs, *_ = env.step(act(call("while True: pass")))
    assert "timed out" in obs[0]["content"]
    obs, *_ = env.step(act(call("print('x' * 100000)")))
    assert "truncated" in obs[0]["content"] and len(obs[0]["content"]) < 10_000
    bad = act({"id": "c9", "type": "function", "function": {"name": "python", "arguments": '{"cod": 1}'}})
    obs, *_ = env.step(bad)
    assert "needs" in obs[0]["content"]
    env.close()


def test_no_network_in_the_local_tool_sandbox():
    from sao.sandboxes import bwrap_usable

    if not bwrap_usable():
        pytest.skip("bubblewrap is not usable here: the local sandbox cannot cut the network")
    import socket

    listener = socket.create_server(("127.0.0.1", 0))  # reachable from the host, not from a new net namespace
    port = listener.getsockname()[1]
    env = E.make("arithmetic", tools="python")
    _episode(env)
    probe = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
             "    print('connected')\nexcept OSError as e:\n    print('refused', type(e).__name__)")
    obs, *_ = env.step(act(call(probe)))
    listener.close()
    assert obs[0]["content"].startswith("refused"), obs[0]["content"]
    env.close()


def test_tools_conform_and_unknown_tool_is_refused():
    E.check_env(E.make("arithmetic", tools="python"))
    with pytest.raises(ValueError, match="tools must be one of"):
        E.make("arithmetic", tools="bash")


def test_tool_prompt_for_templates_without_tool_support(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    env = E.make("arithmetic", tools="python")
    r = ChatRenderer(tok, env.unwrapped.tools)
    assert not r.native_tools  # SmolLM2's ChatML template ignores `tools=`
    obs, _ = env.reset(options={"task_id": "add-d1-s0-i0"})
    prompt = tok.decode(r.prompt(obs))
    assert '"name": "python"' in prompt and "<tool_call>" in prompt
    # A tool turn bridges to the same tokens as rendering the whole conversation.
    said = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    ids = tok.encode(said, add_special_tokens=False) + [tok.eos_token_id]
    c = Completion(tuple(ids), (0.0,) * len(ids), said, "stop")
    tool_msg = [{"role": "tool", "tool_call_id": "c1", "name": "python", "content": "1\n"}]
    bridged = r.prompt(obs) + ids + r.bridge(obs, c, tool_msg)
    assert bridged == r.prompt([*obs, {"role": "assistant", "content": said}, *tool_msg])


@pytest.mark.docker
def test_python_tool_in_docker(docker_client):
    from sao.sandboxes import ensure_base_image

    ensure_base_image(docker_client)
    env = E.make("arithmetic", tools="python", sandbox="docker")
    _episode(env)
    obs, *_ = env.step(act(call("import os; print(sorted(os.listdir('/sys/class/net')), 6*7)")))
    assert obs[0]["content"].strip() == "['lo'] 42"
    env.step("\\boxed{1}")  # the episode's end closes the container
    assert not env.unwrapped.python_tool.started
    env.close()
