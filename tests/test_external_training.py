"""An agent plug-in's episodes as sao-train plays them (sao.agents.external.training): the agent, in its own
subprocess, calls its capture-proxy session with the plain ``openai`` SDK; the calls are rendered with the
run's template and sampled through the client the rollout driver gives the episode (here the fake server's
token route), at the run's settings; an agent that never calls the model fails its episode."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sao.agents import ByteTokenizer, Renderers, RetryPolicy
from sao.agents.capture import CaptureProxy, PinnedSampling, ProjectToolParser
from sao.agents.clients.generate import GenerateClient, generate_base_url
from sao.agents.external.registry import AgentPlugin
from sao.agents.external.runner import ExternalAgentRunner
from sao.agents.external.training import CapturedAgentEpisodes
from sao.agents.records import Trajectory
from sao.agents.testing import FakeServer, Reply
from tests.agent_plugins import FAKE


def play(agent: str, fake: FakeServer, tmp_path: Path) -> Trajectory:
    runner = ExternalAgentRunner("arithmetic", AgentPlugin(agent, f"{FAKE}:{agent}"), timeout_s=60,
                                 require_calls=True, log_dir=tmp_path / "agents")

    async def go() -> Trajectory:
        async with CaptureProxy() as proxy:
            episodes = CapturedAgentEpisodes(runner, proxy, Renderers(ByteTokenizer()), ProjectToolParser(), "policy",
                                             PinnedSampling(temperature=1.0, max_tokens=48))
            client = GenerateClient(generate_base_url(fake.root_url), "fake", retry=RetryPolicy(max_retries=0))
            try:
                return await episodes(client, task_id="add-d1-s0-i3", sample=0, seed=5)
            finally:
                await client.aclose()

    return asyncio.run(go())


def test_the_agents_call_is_sampled_through_the_episode_client_at_the_runs_settings(tmp_path: Path):
    with FakeServer([Reply(text="It is \\boxed{3}.")]) as fake:
        t = play("ask_model", fake, tmp_path)
    # the agent asked for temperature 0 and 64 tokens; the run samples at 1.0, 48 tokens at most
    sent = fake.requests[0]["sampling_params"]
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["max_tokens"]) == (1.0, 1.0, -1, 48)
    assert t.status == "ok" and t.mode == "tokens" and t.info["capture"]["stats"]["pinned_calls"] == 1
    # the record's tokens are the prompt the proxy rendered, then exactly what the engine sampled
    prompt = fake.requests[0]["token_ids"]  # the token route's prompt
    sampled = list(ByteTokenizer().encode("It is \\boxed{3}."))
    n = len(prompt)
    assert list(t.token_ids[:n]) == list(prompt) and not any(t.action_mask[:n])
    assert list(t.token_ids[n:n + len(sampled)]) == sampled and all(t.action_mask[n:])
    assert t.info["agent"]["name"] == "ask_model" and t.info["answer"] is not None


def test_an_agent_that_never_calls_the_model_fails_its_training_episode(tmp_path: Path):
    with FakeServer([]) as fake:
        t = play("silent", fake, tmp_path)
    assert t.status == "failed" and t.info["exit_status"] == "no_calls" and not t.token_ids, t.info
    assert fake.requests == []
