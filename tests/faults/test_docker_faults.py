"""Docker faults during SWE episodes, on the real daemon with the local tasks (``swe-local``).

- A command that goes over the container's memory limit is killed by the kernel; the agent sees it as
  the command's result, and the episode goes on in the same container to a graded end.
- A command that hangs past its time limit is cut (exit 124, every process it started killed); the same.
- dockerd restarted during ``sao-eval swe-local``: the episodes whose containers it took are recorded as
  infrastructure errors (exit 1), no container is left behind once it is back, and ``--resume`` runs
  exactly those again: every task resolved, each once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sao.sandboxes import LABEL_KEY, SandboxLimits, list_labelled
from tests.faults.procs import SAO_EVAL, count_lines, jsonl, tail

pytestmark = [pytest.mark.docker, pytest.mark.long]


def ours(client) -> list:  # type: ignore[no-untyped-def]
    return list_labelled(client, LABEL_KEY)


def bash(command: str, call_id: str = "1") -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}


SUBMIT = {"role": "assistant", "content": "",
          "tool_calls": [{"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}


@pytest.fixture
def small_swe_env(docker_client):  # type: ignore[no-untyped-def]
    """A swe-local environment whose agent container has 256 MB and 3 s per command."""
    import sao.envs as E

    env = E.make("swe-local", command_timeout_s=3.0,
                 limits=SandboxLimits(cpus=1.0, memory_mb=256, pids=256, network=False, default_timeout_s=3.0))
    yield env
    env.close()
    assert ours(docker_client) == [], "a sandbox container was left behind"


def observation(obs: list[dict]) -> str:
    return "\n".join(str(m.get("content")) for m in obs)


def test_a_command_over_the_memory_limit_is_killed_and_the_episode_goes_on(small_swe_env) -> None:
    env = small_swe_env
    env.reset(options={"task_id": env.unwrapped.task_ids()[0]})
    # 1 GiB, touched page by page, in a 256 MB container without swap: the kernel's OOM killer ends it
    obs, _, terminated, truncated, _ = env.step(bash("python3 -c \"b = bytearray(2**30); print('allocated')\""))
    text = observation(obs)
    assert not (terminated or truncated), text
    assert "allocated" not in text and ("[exit code 137]" in text or "MemoryError" in text), text
    obs, *_ = env.step(bash("echo still here", "2"))  # the container lives on
    assert "[exit code 0]" in observation(obs) and "still here" in observation(obs)
    obs, reward, terminated, _, info = env.step(SUBMIT)
    assert terminated and info["exit_status"] == "submitted" and info["error"] is None and reward == 0.0


def test_a_command_that_hangs_past_its_timeout_is_cut_and_the_episode_goes_on(small_swe_env) -> None:
    env = small_swe_env
    env.reset(options={"task_id": env.unwrapped.task_ids()[0]})
    started = time.monotonic()
    obs, _, terminated, truncated, _ = env.step(bash("(sleep 600 &) ; sleep 600"))
    took = time.monotonic() - started
    text = observation(obs)
    assert not (terminated or truncated) and "[exit code 124]" in text, text
    assert took < 30, f"the 3 s limit took {took:.0f} s to cut the command"
    # what the cut command started: none of its `sleep 600` may be left (the image has no ps, so /proc;
    # the container's own keep-alive is `sleep infinity`)
    obs, *_ = env.step(bash("n=0; k=0; for c in /proc/[0-9]*/cmdline; do a=$(tr '\\0' ' ' < $c 2>/dev/null); "
                            "case \"$a\" in 'sleep 600 ') n=$((n+1));; 'sleep infinity ') k=$((k+1));; esac; done; "
                            "echo \"cut=$n keepalive=$k\"", "2"))
    assert "cut=0 keepalive=1" in observation(obs), observation(obs)  # the keep-alive seen: the count can fail
    obs, reward, terminated, _, info = env.step(SUBMIT)
    assert terminated and info["exit_status"] == "submitted" and info["error"] is None and reward == 0.0


def _dockerd() -> tuple[int, list[str]]:
    """The running dockerd's pid and command line; skips unless there is exactly one and we may restart it."""
    if os.geteuid() != 0:
        pytest.skip("restarting dockerd needs root; CI runs as root")
    pids = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    if len(pids) != 1:
        pytest.skip(f"expected one dockerd process to restart, found {len(pids)}")
    argv = Path(f"/proc/{pids[0]}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    # the binary by its absolute path: started as plain `dockerd`, it would be looked up on this PATH, which
    # may lack /usr/sbin (a shell under `env -i`), and the daemon would then stay down for the whole suite
    return int(pids[0]), [os.readlink(f"/proc/{pids[0]}/exe"), *(a.decode() for a in argv[1:])]


def _answers(timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
            return True
        time.sleep(0.5)
    return False


def _runs_a_sandbox(client, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    from sao.sandboxes import BASE_IMAGE, DockerSandbox, SandboxError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with DockerSandbox(BASE_IMAGE, client=client, label="pytest-dockerd-back") as sb:
                if sb.run("true").exit_code == 0:
                    return True
        except SandboxError:
            pass
        time.sleep(1.0)
    return False


def _start_dockerd(argv: list[str], cores: set[int], out) -> None:  # type: ignore[no-untyped-def]
    subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                     preexec_fn=lambda: os.sched_setaffinity(0, cores))


def _restart_dockerd(pid: int, argv: list[str], cores: set[int]) -> None:
    """SIGTERM dockerd (it stops every container), wait for its exit, start it again as it was started:
    its command line, and its cores (this test may run pinned to one, tests/workers.py; a daemon started
    from here would keep that one and refuse every container that asks for more, for the rest of the machine's life)."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), "dockerd did not stop within 60 s of SIGTERM"
    with open("/var/log/dockerd.log", "ab") as log:
        _start_dockerd(argv, cores, log)
    assert _answers(120), "dockerd did not answer within 120 s of its restart"
    new = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    assert [os.sched_getaffinity(int(p)) for p in new] == [cores], "dockerd came back on other cores"


def test_dockerd_restarted_during_a_swe_local_eval_is_an_infra_error_retried_on_resume(docker_client,
                                                                                        tmp_path: Path) -> None:
    from sao.envs.swebench import build_local_tasks

    pid, argv = _dockerd()
    cores = os.sched_getaffinity(pid)
    build_local_tasks()  # the images first: the restart is to hit episodes, not the build
    out, log = tmp_path / "run", tmp_path / "eval.log"
    args = [SAO_EVAL, "swe-local", "--agent", "gold", "--concurrency", "2", "--output", str(out)]
    with log.open("wb") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        # an episode done and others in flight in their containers: then the daemon goes away under them
        while not (count_lines(out / "trajectories.jsonl") >= 1
                   and any(c.status == "running" for c in ours(docker_client))):
            assert proc.poll() is None, f"sao-eval ended before the restart:\n{tail(log)}"
            assert time.monotonic() < deadline, f"no episode in flight after 5 min:\n{tail(log)}"
            time.sleep(0.2)
        _restart_dockerd(pid, argv, cores)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        _answers(120) or _start_dockerd(argv, cores, subprocess.DEVNULL)  # leave a daemon for the next test
    import docker

    client = docker.from_env()  # the session's client may hold a connection of the old daemon
    try:
        records = jsonl(out / "trajectories.jsonl")
        tasks = {r["task_id"] for r in records}
        assert len(records) == len(tasks), "an instance was recorded twice"
        infra = [r for r in records if r["status"] == "failed" or r["info"].get("error")]
        assert infra, f"the restart cut no episode; log:\n{tail(log)}"
        assert all(r.get("failure") in (None, "infra_error") for r in infra), [r.get("failure") for r in infra]
        assert proc.returncode == 1 and json.loads((out / "summary.json").read_text())["infra_errors"] == len(infra)
        assert ours(client) == [], "containers of the cut episodes were left behind"

        # `docker info` answers before the restarted daemon runs containers again (containerd, the networks):
        # the resume is to meet a daemon that is back, so wait until a sandbox runs a command
        assert _runs_a_sandbox(client, 120), "the restarted dockerd ran no container within 120 s"
        resumed = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["infra_errors"] == 0 and summary["resolved"] == summary["n_instances"] == len(tasks)
        results = jsonl(out / "results.jsonl")
        assert sorted(r["task_id"] for r in results) == sorted(tasks) and all(r["correct"] == [True] for r in results)
        assert ours(client) == []
    finally:
        client.close()
