"""`sao-eval` under bad input (issue 14): broken plug-in environments are refused before an engine
starts, the environment's own failures are `env_errors` (counted apart, not retried), output paths
are checked up front, SIGTERM says how to resume, and a no-op `--resume` keeps the run times.

The plug-ins are installed as a user's would be found (the `sao.envs` entry-point group), from a
`*.dist-info` folder on PYTHONPATH; the model is the scripted fake server or a scripted agent."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sao.agents import ChatRenderer, ByteTokenizer, LoopConfig, OpenAICompletionClient, RetryPolicy, run_episode
from sao.agents.store import read_trajectories
from sao.agents.testing.fake_server import FakeServer, Reply

SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))

PLUGINS = '''
import gymnasium as gym

from sao.envs import AssistantMessageSpace, MessagesSpace, TextEnv


class FourTuple(gym.Env):
    """Gym's old step API: (observation, reward, done, info)."""

    gym_id = "rel/FourTuple-v0"
    observation_space = MessagesSpace()
    action_space = AssistantMessageSpace()
    tools = ()

    def task_ids(self, limit=None):
        return ["a", "b"][:limit]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "Say a."}], {"task_id": (options or {}).get("task_id", "a")}

    def step(self, action):
        return [], 1.0, True, {"correct": True, "answer": None, "error": None}


class Tasks(TextEnv):
    """Four tasks; the answer is 42."""

    def task_ids(self, limit=None):
        return [f"t{i}" for i in range(4)][:limit]

    def _begin(self, task_id):
        self.task = task_id or f"t{int(self.np_random.integers(4))}"
        if self.task not in self.task_ids():
            raise KeyError(task_id)
        return [{"role": "user", "content": f"Task {self.task}: say 42."}], {"task_id": self.task}

    def _respond(self, action):
        correct = "42" in (action.get("content") or "")
        return [], float(correct), True, False, {"correct": correct, "answer": action.get("content"), "error": None}


class StringReward(Tasks):
    gym_id = "rel/StringReward-v0"

    def _respond(self, action):
        return [], "1", True, False, {"correct": True, "answer": None, "error": None}


def answer_42(env, name, task_id):
    return lambda obs, info: {"role": "assistant", "content": "42"}


class Flaky(Tasks):
    """t1: a bug of the environment; t2: the disk fails; t0 and t3 are fine."""

    gym_id = "rel/Flaky-v0"
    scripted_policies = staticmethod(answer_42)

    def _respond(self, action):
        if self.task == "t1":
            return 1 / 0
        if self.task == "t2":
            raise OSError("disk full")
        return super()._respond(action)
'''

ENTRY_POINTS = '''
[sao.envs]
four-tuple = sao_reliability_plugins:FourTuple
string-reward = sao_reliability_plugins:StringReward
flaky = sao_reliability_plugins:Flaky
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder that, on PYTHONPATH, installs the plug-ins above (a module and its dist-info)."""
    root = tmp_path_factory.mktemp("plugins")
    (root / "sao_reliability_plugins.py").write_text(textwrap.dedent(PLUGINS))
    info = root / "sao_reliability_plugins-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sao-reliability-plugins\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(ENTRY_POINTS))
    return root


def sao_eval(*args: str, site: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"PYTHONPATH": str(site)} if site else {})}
    return subprocess.run([SAO_EVAL, *args], capture_output=True, text=True, timeout=timeout, env=env)


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# -- item 2: a broken environment is refused before an engine starts; env errors apart from infra ----


def test_contract_a_plugin_whose_step_returns_a_4_tuple_exits_2_before_an_engine_starts(site, tmp_path):
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = sao_eval("four-tuple", "--output", str(out), site=site)  # no --base-url: a local vLLM would start
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert elapsed < 10, elapsed
    assert "rel/FourTuple-v0 breaks the text-environment contract" in proc.stderr
    assert "step must return a 5-tuple (observation, reward, terminated, truncated, info), got a tuple of 4" in proc.stderr
    assert not out.exists()  # nothing started, nothing written


def test_a_plugin_with_a_string_reward_is_refused(site, tmp_path):
    proc = sao_eval("string-reward", "--output", str(tmp_path / "out"), site=site)
    assert proc.returncode == 2 and "reward must be a real number (int or float), got str '1'" in proc.stderr


@pytest.mark.parametrize("agent", ["gold", "llm"])
def test_env_errors_are_counted_apart_and_not_retried_by_resume(site, tmp_path, agent):
    out = tmp_path / "out"

    def run(*extra: str) -> subprocess.CompletedProcess:
        if agent == "gold":
            return sao_eval("flaky", "--agent", "gold", "--output", str(out), *extra, site=site)
        with FakeServer(responder=lambda request, prompt: Reply(text="42"), chat_only=True) as server:
            proc = sao_eval("flaky", "--base-url", server.base_url, "--model", "m", "--endpoint-mode", "chat",
                            "--output", str(out), *extra, site=site)
            run.requests = len(server.requests)
            return proc

    proc = run()
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = summary_of(out)
    assert (summary["n_episodes"], summary["n_failed"], summary["env_errors"], summary["infra_errors"]) == (4, 2, 1, 1)
    assert summary["resolved"] == 2
    assert "1 episode(s) failed in the environment's own code" in proc.stderr and "will not retry" in proc.stderr
    by_task = {t.task_id: t for t in read_trajectories(out / "trajectories.jsonl")}
    assert by_task["t1"].failure == "env_error" and "ZeroDivisionError" in by_task["t1"].error
    assert by_task["t2"].failure == "infra_error" and "disk full" in by_task["t2"].error
    assert by_task["t0"].failure is None and by_task["t0"].status == "ok"

    proc = run("--resume")  # only the infrastructure error runs again (and fails again: the disk is still full)
    assert proc.returncode == 1, proc.stderr[-3000:]
    again = [t.task_id for t in read_trajectories(out / "trajectories.jsonl")][4:]
    assert again == ["t2"]
    if agent == "llm":
        assert run.requests == 1
    summary = summary_of(out)
    assert (summary["n_episodes"], summary["env_errors"], summary["infra_errors"], summary["timed_runs"]) == (4, 1, 1, 2)


def _client_episode(env):
    async def go(server):
        client = OpenAICompletionClient(server.base_url, "fake", retry=RetryPolicy(max_retries=1, backoff_s=0.01))
        try:
            return await run_episode(env, client, ChatRenderer(ByteTokenizer()), LoopConfig(), env_name="x",
                                     task_id="t0")
        finally:
            await client.aclose()

    with FakeServer([Reply(text="42")]) as server:
        return asyncio.run(go(server))


def test_the_token_loop_names_the_failure(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    import sao_reliability_plugins as plugins

    class OldApi(plugins.Tasks):
        def step(self, action):  # a 4-tuple in the middle of an episode
            return [], 1.0, True, {}

    class BadReward(plugins.Tasks):
        def step(self, action):
            return [], None, True, False, {}

    class Disk(plugins.Tasks):
        def _respond(self, action):
            raise OSError("disk on fire")

    t = _client_episode(OldApi())
    assert t.status == "failed" and t.failure == "env_error" and "got a tuple of 4" in t.error
    assert t.num_action_tokens > 0 and t.info["correct"] is False  # the sampled tokens are kept
    t = _client_episode(BadReward())
    assert t.failure == "env_error" and "reward must be a real number" in t.error
    t = _client_episode(Disk())
    assert t.failure == "infra_error" and "OSError: disk on fire" in t.error
    t = _client_episode(plugins.Tasks())
    assert t.status == "ok" and t.failure is None and t.correct


# -- item 6: output paths ------------------------------------------------------------------------


def _unwritable() -> list[str]:
    """Under a file, and on sysfs (where not even root creates a file)."""
    return ((["/etc/passwd/x"] if Path("/etc/passwd").is_file() else [])
            + (["/sys/sao-eval-out"] if Path("/sys/kernel").is_dir() else []))


@pytest.mark.parametrize("where", [*_unwritable(), "FILE", "UNDER_FILE"])
def test_contract_an_unusable_output_exits_2_with_one_line(tmp_path, where):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    output = {"FILE": str(afile), "UNDER_FILE": str(afile / "x")}.get(where, where)
    proc = sao_eval("arithmetic", "--output", output)  # the default agent: a local vLLM would start
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --output {output}: "), proc.stderr
    assert afile.read_text() == "x"


@pytest.mark.parametrize("name", ["results.jsonl", "trajectories.jsonl", "summary.json"])
def test_an_output_file_that_is_a_folder_fails_before_any_episode(tmp_path, name):
    (tmp_path / name).mkdir()
    proc = sao_eval("arithmetic", "--agent", "gold", "--limit", "2", "--output", str(tmp_path))
    assert proc.returncode == 2 and f"{name} is not a regular file" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing ran, nothing written


# -- item 7: SIGTERM, and the times of a no-op --resume -----------------------------------------


def test_sigterm_exits_143_and_says_how_to_resume(tmp_path):
    out = tmp_path / "out"

    def slow(request: dict, prompt: str) -> Reply:
        return Reply(text="\\boxed{0}", delay_s=0.3)

    with FakeServer(responder=slow, chat_only=True) as server:
        proc = subprocess.Popen([SAO_EVAL, "arithmetic", "--limit", "40", "--concurrency", "1", "--base-url",
                                 server.base_url, "--model", "m", "--endpoint-mode", "chat", "--output", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 90
        while not (out / "trajectories.jsonl").exists() or not (out / "trajectories.jsonl").read_text().count("\n"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr[-3000:]
    assert "terminated (SIGTERM)" in stderr and f"--resume --output {out}" in stderr and "Traceback" not in stderr
    before = len(read_trajectories(out / "trajectories.jsonl"))
    assert 1 <= before < 40
    with FakeServer(responder=lambda request, prompt: Reply(text="\\boxed{0}"), chat_only=True) as server:
        proc2 = sao_eval("arithmetic", "--limit", "40", "--concurrency", "4", "--base-url", server.base_url,
                         "--model", "m", "--endpoint-mode", "chat", "--output", str(out), "--resume")
        assert len(server.requests) == 40 - before  # nothing lost, nothing run twice
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert summary_of(out)["n_episodes"] == 40


def test_a_noop_resume_keeps_the_run_times(tmp_path):
    out = tmp_path / "out"
    assert sao_eval("arithmetic", "--agent", "gold", "--limit", "3", "--output", str(out)).returncode == 0
    first = summary_of(out)
    assert first["timed_runs"] == 1 and first["wall_s"] > 0 and first["rollout_s"] > 0
    proc = sao_eval("arithmetic", "--agent", "gold", "--limit", "3", "--output", str(out), "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = summary_of(out)
    assert {k: again[k] for k in ("wall_s", "rollout_s", "timed_runs")} == \
        {k: first[k] for k in ("wall_s", "rollout_s", "timed_runs")}
