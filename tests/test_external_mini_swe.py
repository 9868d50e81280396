"""mini-swe-agent, unchanged, as the ``mini-swe-agent`` plug-in (sao.agents.external.mini_swe).

Against the scripted server (its native ``bash`` tool calls, the submission protocol of its SWE-bench config)
with a stand-in ``docker`` CLI (sao.agents.testing.fake_docker) that records what the agent's environment
ran; and once with real Docker on a local SWE task's image, where the patch it submits is graded by the
project's grader and its container is checked for the sandbox rules while it runs and for being gone after.
Needs the extra ``agents-mini-swe``: skipped without it.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from sao.agents.external.task import AgentEndpoint, AgentTask, SandboxRules
from sao.agents.testing import FakeServer, Reply, fake_docker

pytest.importorskip("minisweagent", reason="mini-swe-agent is an optional extra: pip install -e '.[agents-mini-swe]'")

from sao.agents.external import mini_swe  # noqa: E402

RULES = SandboxRules(cpus=1.5, memory_mb=768, pids=128, labels={"io.sao.sandbox": "pytest-mini", "io.sao.episode": "e1"})
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"


def bash(command: str, i: int) -> dict:
    """A tool call in mini-swe-agent's format: its one tool, ``bash``, with ``{"command": ...}``."""
    return {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def replies(*commands: str) -> list[Reply]:
    return [Reply(text=f"THOUGHT: step {i}", tool_calls=(bash(c, i),)) for i, c in enumerate(commands, 1)]


def swe_task(**kwargs) -> AgentTask:
    kwargs = {"env": "swe-local", "task_id": "t1", "episode_id": "e1", "prompt": "the env's prompt",
              "image": "img:1", "repo_path": "/testbed", "sandbox": RULES, "step_limit": 6, "timeout_s": 300,
              "extra": {"problem_statement": "`add` subtracts"}, **kwargs}
    return AgentTask(**kwargs)


@pytest.fixture
def docker_cli(tmp_path):
    """The stand-in ``docker`` and a git repository at the fake container's /testbed with a bug in calc.py."""
    exe = fake_docker.install(tmp_path)
    repo = tmp_path / "root" / "testbed"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    subprocess.run("git init -q && git add . && git -c user.name=t -c user.email=t@t commit -qm base",
                   shell=True, cwd=repo, check=True)
    return exe


def test_config_is_its_swebench_config_with_the_task_and_endpoint_merged_in():
    config = mini_swe.agent_config(swe_task(step_limit=7, timeout_s=600), AgentEndpoint("http://h:1/s/x/v1", "pol", "k"))
    env, model, agent = config["environment"], config["model"], config["agent"]
    assert env["run_args"] == ["--rm", "--network", "none", "--cpus", "1.5", "--memory", "768m", "--memory-swap", "768m",
                               "--pids-limit", "128", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--init",
                               "--label", "io.sao.episode=e1", "--label", "io.sao.sandbox=pytest-mini"]
    assert (env["image"], env["cwd"], env["container_timeout"]) == ("img:1", "/testbed", "660s")
    assert model["model_name"] == "openai/pol" and model["cost_tracking"] == "ignore_errors"
    # the endpoint's values merged into its own model_kwargs, which are kept
    assert model["model_kwargs"] == {"api_base": "http://h:1/s/x/v1", "api_key": "k", "drop_params": True,
                                     "parallel_tool_calls": True}
    assert (agent["step_limit"], agent["cost_limit"], agent["wall_time_limit_seconds"]) == (7, 0, 540)
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in agent["instance_template"]  # its own prompts
    assert mini_swe.agent_config(swe_task(step_limit=None), AgentEndpoint("u", "m"))["agent"]["step_limit"] == 250


def test_it_fixes_submits_and_its_container_carries_the_rules_and_is_removed(docker_cli, tmp_path):
    commands = ["sed -i 's/a - b/a + b/' calc.py", "git diff -- calc.py > patch.txt", SUBMIT]
    with FakeServer(replies(*commands), chat_only=True) as server:
        result = mini_swe.solve(swe_task(), AgentEndpoint(server.base_url, "policy"), docker=str(docker_cli))
    assert result.patch.startswith("diff --git a/calc.py b/calc.py")
    assert "-    return a - b\n+    return a + b\n" in result.patch
    assert result.steps == 3 and result.info["exit_status"] == "Submitted" and result.info["container_removed"]
    first, second = server.requests[:2]
    assert first["model"] == "policy"  # litellm's "openai/" prefix is not sent
    assert [t["function"]["name"] for t in first["tools"]] == ["bash"]
    assert "`add` subtracts" in first["messages"][1]["content"]  # the problem statement, not the env's prompt
    assert second["messages"][-1]["role"] == "tool" and second["messages"][-1]["tool_call_id"] == "call_1"
    calls = fake_docker.calls(tmp_path)
    start = calls[0]
    assert start[:2] == ["run", "-d"] and start[start.index("-w") + 1] == "/testbed"
    assert start[start.index("--rm"):start.index("img:1")] == ["--rm", *RULES.docker_run_args()]
    container = start[start.index("--name") + 1]
    assert [c[0] for c in calls[1:4]] == ["exec"] * 3 and [c[-1] for c in calls[1:4]] == commands
    assert calls[-1] == ["rm", "-f", container]  # removed at once, not by its background `docker stop`


def test_the_setup_command_runs_in_its_container_before_the_first_call(docker_cli, tmp_path, capsys):
    task = swe_task(extra={"problem_statement": "`add` subtracts", "setup_command": "git tag -f prepared"})
    with FakeServer(replies(SUBMIT), chat_only=True) as server:
        result = mini_swe.solve(task, AgentEndpoint(server.base_url, "policy"), docker=str(docker_cli))
    calls = fake_docker.calls(tmp_path)
    assert calls[1][0] == "exec" and calls[1][-1] == "git tag -f prepared"  # before the agent's own commands
    assert calls[2][-1] == SUBMIT and result.info["setup_command_ran"] is True
    tags = subprocess.run(["git", "tag"], cwd=tmp_path / "root" / "testbed", capture_output=True, text=True).stdout
    assert tags.split() == ["prepared"]
    assert "setup_command ran in the agent's container (exit 0)" in capsys.readouterr().out
    without = swe_task(extra={"problem_statement": "x"})
    with FakeServer(replies(SUBMIT), chat_only=True) as server:
        assert mini_swe.solve(without, AgentEndpoint(server.base_url, "policy"),
                              docker=str(docker_cli)).info["setup_command_ran"] is False


def test_a_failing_setup_command_raises_before_any_model_call(docker_cli, tmp_path):
    task = swe_task(extra={"setup_command": "exit 3"})
    with FakeServer(replies(SUBMIT), chat_only=True) as server:
        with pytest.raises(RuntimeError, match=r"preparing the repository in the agent's container failed \(exit 3\)"):
            mini_swe.solve(task, AgentEndpoint(server.base_url, "policy"), docker=str(docker_cli))
    assert not server.requests and fake_docker.calls(tmp_path)[-1][:2] == ["rm", "-f"]


def test_the_step_limit_ends_the_run_without_a_patch(docker_cli, tmp_path):
    script = [Reply(text="no tool call: a format error, which counts as a step"), *replies("true", "true", SUBMIT)]
    with FakeServer(script, chat_only=True) as server:
        result = mini_swe.solve(swe_task(step_limit=2), AgentEndpoint(server.base_url, "policy"),
                                docker=str(docker_cli))
    assert (result.patch, result.steps, result.info["exit_status"]) == ("", 2, "LimitsExceeded")
    assert len(server.requests) == 2
    assert fake_docker.calls(tmp_path)[-1][:2] == ["rm", "-f"]


def test_a_failed_model_call_raises_and_the_container_is_still_removed(docker_cli, tmp_path):
    import litellm

    with FakeServer([Reply(status=404, error="no such model")], chat_only=True) as server:
        with pytest.raises(litellm.exceptions.NotFoundError, match="no such model"):
            mini_swe.solve(swe_task(), AgentEndpoint(server.base_url, "policy"), docker=str(docker_cli))
    calls = fake_docker.calls(tmp_path)
    assert calls[0][0] == "run" and calls[-1] == ["rm", "-f", calls[0][calls[0].index("--name") + 1]]


def test_a_task_without_an_image_is_refused():
    with pytest.raises(ValueError, match="needs a container image"):
        mini_swe.run(swe_task(image=None), AgentEndpoint("http://127.0.0.1:9/v1", "m"))


def test_the_issue_text_is_the_problem_statement_when_given():
    assert mini_swe.problem_statement(swe_task()) == "`add` subtracts"
    assert mini_swe.problem_statement(swe_task(extra={})) == "the env's prompt"


# -- real Docker ---------------------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.slow
def test_on_a_real_swe_image_its_patch_resolves_the_task_and_no_container_is_left(docker_client):
    from sao.envs.swebench import grade_prediction, local_tasks, local_tasks_dir, swe_local
    from sao.sandboxes import LABEL_KEY, gc, list_labelled
    from sao.sandboxes.docker import OWNER_LABEL_KEY
    from sao.sandboxes.orphans import owner_label

    label = f"pytest-mini-{uuid.uuid4().hex[:10]}"
    env = swe_local(data=str(local_tasks.build(local_tasks_dir(), label=label, client=docker_client)), label=label)
    iid = "sao-local__intervals-1"
    inst = env.get(iid)
    rules = SandboxRules(cpus=1.0, memory_mb=512, pids=100,
                         labels={LABEL_KEY: label, OWNER_LABEL_KEY: owner_label(), "io.sao.episode": "e-real"})
    task = swe_task(task_id=iid, image=env.resolve_image(inst).name, sandbox=rules, timeout_s=600,
                    extra={"problem_statement": inst.problem_statement})
    commands = ["ls /sys/class/net", "sed -i 's/start < result\\[-1\\]\\[1\\]/start <= result[-1][1]/' intervals/core.py",
                "git diff -- intervals/core.py > patch.txt", SUBMIT]
    script, seen = replies(*commands), []

    def responder(request, prompt):  # every request: look at the agent's container while it runs
        seen.extend(list_labelled(docker_client, f"{LABEL_KEY}={label}"))
        return script.pop(0)

    try:
        with FakeServer(responder=responder, chat_only=True) as server:
            result = mini_swe.run(task, AgentEndpoint(server.base_url, "policy"))
        left = list_labelled(docker_client, f"{LABEL_KEY}={label}")
        assert result.info["exit_status"] == "Submitted" and result.steps == 4
        assert server.requests[1]["messages"][-1]["content"].split("<output>")[1].split() == ["lo", "</output>"]
        assert {c.id for c in seen} and len({c.id for c in seen}) == 1  # one container, the whole run
        host = seen[0].attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["AutoRemove"] is True
        assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (10**9, 512 * 2**20, 100)
        assert rules.labels.items() <= seen[0].labels.items()
        assert not left, f"containers left: {[c.name for c in left]}"
        graded = grade_prediction(env, iid, result.patch)
        assert graded["error"] is None and graded["correct"] is True, graded.get("report")
    finally:
        env.close()
        gc(label=label, client=docker_client)
