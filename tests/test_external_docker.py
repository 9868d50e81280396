"""An agent plug-in on a SWE task with real Docker (run serially): the container the agent starts itself
carries the project's sandbox rules and the episode's labels, and when the agent hangs past its timeout
it is killed and its container removed: none is left. What an agent returns on a SWE task is graded as
a patch."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest

from sao.agents.external.containers import EPISODE_LABEL_KEY
from sao.agents.external.registry import AgentPlugin
from sao.agents.external.runner import ExternalAgentRunner
from sao.agents.external.sessions import PassThroughSessions
from sao.agents.external.task import AgentEndpoint
from sao.agents.loop import opened
from sao.agents.records import Trajectory
from sao.envs import make
from sao.sandboxes import list_labelled
from tests.agent_plugins import FAKE

SESSIONS = PassThroughSessions(AgentEndpoint("http://127.0.0.1:9/v1", "fake"))


def play(agent: str, tmp_path: Path, timeout_s: float) -> Trajectory:
    external = ExternalAgentRunner("swe-local", AgentPlugin(agent, f"{FAKE}:{agent}"), timeout_s=timeout_s,
                                   log_dir=tmp_path)

    async def go() -> Trajectory:
        async with opened("swe-local", {}) as env:
            return await external.play(env, SESSIONS, task_id=env.unwrapped.task_ids(1)[0])

    return asyncio.run(go())


@pytest.mark.docker
@pytest.mark.part("docker")
def test_a_hung_agents_container_is_removed_after_its_timeout(docker_client, tmp_path: Path):
    import docker.errors

    t = play("hang_in_container", tmp_path, timeout_s=10.0)
    assert t.status == "failed" and t.info["exit_status"] == "agent_timeout", t.info["agent"].get("log_tail")
    folder = tmp_path / t.episode_id
    container_id = (folder / "container.id").read_text().strip()
    inspected = json.loads((folder / "container.json").read_text())[0]
    labels = inspected["Config"]["Labels"]
    assert labels["io.sao.sandbox"] == "1" and labels[EPISODE_LABEL_KEY] == t.episode_id
    assert labels["io.sao.sandbox.owner"] == f"{socket.gethostname()}:{os.getpid()}"  # the reaper's owner: us
    host, limits = inspected["HostConfig"], make("swe-local").unwrapped.limits  # the environment's own limits
    assert host["NetworkMode"] == "none" and host["Memory"] == limits.memory_mb * 2**20
    assert host["PidsLimit"] == limits.pids and host["NanoCpus"] == round(limits.cpus * 10**9)
    assert inspected["Config"]["Image"].startswith("sao-swe-local/")  # the instance's image, from the brief
    assert t.info["agent"]["containers_removed"] == [inspected["Name"].lstrip("/")]
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container_id)
    assert list_labelled(docker_client, f"{EPISODE_LABEL_KEY}={t.episode_id}") == []


@pytest.mark.docker
def test_a_swe_agent_that_returns_no_patch_is_graded_as_an_empty_patch(docker_client, tmp_path: Path):
    t = play("silent", tmp_path, timeout_s=60.0)
    assert t.status == "ok" and t.reward == 0.0 and t.info["exit_status"] == "agent_returned"
    assert t.info["report"]["status"] == "empty_patch" and t.info["image"].startswith("sao-swe-local/")
