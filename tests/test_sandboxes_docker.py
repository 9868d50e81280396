"""DockerSandbox against a real Docker daemon and the local base image (no mocks of Docker).

Skipped with a reason when no daemon answers, unless ``SAO_REQUIRE_DOCKER=1`` (CI), which turns
a missing daemon into a failure. The base image is built on first use (about 75 s on 2 cores);
once it exists the module takes well under 90 s. Every container made here carries the label
``io.sao.sandbox=<this module's unique value>`` and is removed at the end even if a test fails.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from sao.sandboxes import (
    LABEL_KEY,
    DockerSandbox,
    ExecResult,
    SandboxClosedError,
    SandboxLimits,
    SandboxPool,
    SandboxStartError,
    ensure_base_image,
    gc,
    list_labelled,
)
from sao.sandboxes.cli import main as cli_main

LABEL = f"pytest-{uuid.uuid4().hex[:10]}"
pytestmark = pytest.mark.part("docker")  # every test here runs on the real daemon


@pytest.fixture(scope="module")
def client(docker_client):
    c = docker_client
    yield c
    gc(label=LABEL, client=c)


@pytest.fixture(scope="module")
def image(client) -> str:
    return ensure_base_image(client)


@pytest.fixture(scope="module")
def sb(image, client):
    """One shared sandbox with default limits, for tests that leave no state behind."""
    with DockerSandbox(image, label=LABEL, client=client) as sandbox:
        yield sandbox


def sandbox(image, client, **kw) -> DockerSandbox:
    kw.setdefault("label", LABEL)
    return DockerSandbox(image, client=client, **kw)


def processes(sb: DockerSandbox) -> list[str]:
    """Command lines of every process in the container (minbase has no `ps`)."""
    listing = sb.run(r"for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
    assert listing.exit_code == 0, listing
    return [line.strip() for line in listing.output.splitlines() if line.strip()]


def containers(client, label: str) -> list:
    return list_labelled(client, f"{LABEL_KEY}={label}")


# -- commands ------------------------------------------------------------------------------------


def test_run_returns_exit_code_and_combined_output(sb):
    result = sb.run("echo to-stdout; echo to-stderr >&2; exit 3")
    assert isinstance(result, ExecResult)
    assert result.exit_code == 3 and not result.timed_out and not result.truncated
    assert "to-stdout\n" in result.output and "to-stderr\n" in result.output
    assert 0 < result.duration_s < 10


def test_run_workdir_env_and_shell_features(sb):
    result = sb.run('pwd; echo "$GREETING"; ls /nonexistent-path 2>&1 | head -1', workdir="/tmp",
                    env={"GREETING": "hello world"})
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[:2] == ["/tmp", "hello world"] and "No such file" in lines[2]
    assert sb.run("cd /nonexistent-dir && echo no", workdir="/").exit_code != 0
    assert sb.run("python3 -c 'import sys; print(sys.version_info[0])'").output == "3\n"


def test_timeout_kills_the_whole_process_tree(sb):
    # Plain child, background child, a child in its own session, one that dropped the run tag.
    command = ("echo started; sleep 1001 & setsid sleep 1002 & env -u SAO_RUN_ID sleep 1003 & "
               "sh -c 'sleep 1004' & sleep 1000")
    start = time.monotonic()
    result = sb.run(command, timeout_s=2)
    elapsed = time.monotonic() - start
    assert result.timed_out and result.exit_code == 124
    assert result.output.startswith("started\n")
    assert result.output.endswith("\n[... command timed out after 2 s and was killed ...]\n")
    assert "__SAO_TIMEOUT" not in result.output
    assert 1.9 < elapsed < 6, elapsed
    left = [p for p in processes(sb) if p.startswith("sleep 100")]
    assert left == [], f"processes survived the timeout: {left}"


def test_background_processes_do_not_outlive_run(sb):
    start = time.monotonic()
    result = sb.run("sleep 1011 & setsid sleep 1012 & echo launched")
    assert result.exit_code == 0 and result.output == "launched\n"
    assert time.monotonic() - start < 3
    assert [p for p in processes(sb) if p.startswith("sleep 101")] == []


def test_client_deadline_returns_when_the_exec_hangs(image, client):
    # A paused container freezes the command and its timer, so only the client's deadline can end the run.
    with sandbox(image, client) as box:
        box.client_grace_s, box.kill_grace_s = 1.0, 1.0
        container = client.containers.get(box.id)
        pause = threading.Timer(0.5, container.pause)
        pause.start()
        try:
            start = time.monotonic()
            result = box.run("echo before; sleep 30", timeout_s=1)
            elapsed = time.monotonic() - start
        finally:
            pause.join()
            container.unpause()
        assert result.timed_out and result.exit_code == 124 and "before" in result.output
        assert elapsed < 8, elapsed
        assert box.run("echo alive").output == "alive\n"


def test_memory_limit_holds(image, client):
    with sandbox(image, client, limits=SandboxLimits(memory_mb=128)) as box:
        result = box.run("python3 -c \"x = b'x' * (512 * 1024 * 1024); print('allocated')\"", timeout_s=30)
        assert result.exit_code != 0 and "allocated" not in result.output, result
        assert box.run("echo still-usable").output == "still-usable\n"


def test_pids_limit_holds_and_the_sandbox_recovers(image, client):
    with sandbox(image, client, limits=SandboxLimits(pids=64)) as box:
        result = box.run("f() { f | f & }; f; sleep 1; echo bomb-done", timeout_s=20)
        assert "fork" in result.output.lower(), result.output[:500]  # "sh: 1: Cannot fork"
        assert box.run("echo recovered").output == "recovered\n"
        assert [p for p in processes(box) if p.startswith("sh -c f()")] == []


def test_network_is_off_by_default(sb):
    assert sb.run("ls /sys/class/net").output.split() == ["lo"]
    probe = sb.run(textwrap.dedent("""\
        python3 -c '
        import socket
        s = socket.socket(); s.settimeout(3)
        try:
            s.connect(("1.1.1.1", 53)); print("CONNECTED")
        except OSError as exc:
            print("refused", exc)
        '"""))
    assert "refused" in probe.output and "CONNECTED" not in probe.output, probe


def test_container_carries_the_limits(image, client):
    limits = SandboxLimits(cpus=0.5, memory_mb=300, pids=99, network=True)
    with sandbox(image, client, limits=limits) as box:
        host = client.api.inspect_container(box.id)["HostConfig"]
        assert (host["NanoCpus"], host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (
            500_000_000, 300 * 2**20, 300 * 2**20, 99)
        assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"] and host["Init"]
        assert host["NetworkMode"] != "none" and "eth0" in box.run("ls /sys/class/net").output.split()


def test_no_capabilities_and_no_new_privileges(sb):
    status = sb.run("grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status").output.split()
    assert status == ["CapEff:", "0000000000000000", "CapBnd:", "0000000000000000", "NoNewPrivs:", "1"]
    assert sb.run("touch /tmp/owned && chown 1 /tmp/owned").exit_code != 0  # CAP_CHOWN is gone


def test_output_is_truncated_with_a_marker(image, client):
    with sandbox(image, client, limits=SandboxLimits(output_limit_bytes=1000)) as box:
        result = box.run("seq 1 100000")
    assert result.exit_code == 0 and result.truncated
    assert result.output.startswith("1\n2\n3\n") and result.output.endswith("99999\n100000\n")
    total = sum(len(f"{i}\n") for i in range(1, 100001))
    assert f"\n[... output truncated: {total - 1000} bytes omitted ...]\n" in result.output


def test_binary_output_does_not_crash(sb):
    result = sb.run("head -c 200000 /dev/urandom")
    assert result.exit_code == 0 and result.truncated and isinstance(result.output, str)
    assert sb.run(r"printf 'ok\377\376end'").output == "ok\ufffd\ufffdend"


# -- files ---------------------------------------------------------------------------------------


def test_file_round_trip_and_listing(sb):
    blob = bytes(range(256)) * 100
    sb.write_file("/work/deep/dir/blob.bin", blob)
    sb.write_file("/work/deep/dir/script.sh", "#!/bin/sh\necho from-script\n", mode=0o755)
    assert sb.read_file("/work/deep/dir/blob.bin") == blob
    assert sb.list_dir("/work/deep/dir") == ["blob.bin", "script.sh"]
    assert sb.run("/work/deep/dir/script.sh").output == "from-script\n"
    assert sb.run("stat -c %a /work/deep/dir/blob.bin").output == "644\n"
    sb.run("ln -sf /work/deep/dir/script.sh /work/link; touch /work/.hidden")
    assert sb.read_file("/work/link").startswith(b"#!/bin/sh")
    assert sb.list_dir("/work") == [".hidden", "deep", "link"]
    assert sb.read_file("work/deep/dir/script.sh").startswith(b"#!")  # relative to the workdir, /


def test_file_errors(sb):
    with pytest.raises(FileNotFoundError):
        sb.read_file("/no/such/file")
    with pytest.raises(IsADirectoryError):
        sb.read_file("/etc")
    with pytest.raises(FileNotFoundError):
        sb.list_dir("/no/such/dir")
    with pytest.raises(NotADirectoryError):
        sb.list_dir("/etc/hostname")


# -- life cycle ----------------------------------------------------------------------------------


def test_close_removes_the_container_and_is_idempotent(image, client):
    import docker.errors

    box = sandbox(image, client)
    container_id = box.id
    assert client.containers.get(container_id).labels[LABEL_KEY] == LABEL
    box.close()
    box.close()
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(container_id)
    with pytest.raises(SandboxClosedError):
        box.run("true")
    with pytest.raises(SandboxClosedError):
        box.read_file("/etc/hostname")


def test_context_manager_removes_the_container_on_error(image, client):
    import docker.errors

    with pytest.raises(RuntimeError):
        with sandbox(image, client) as box:
            container_id = box.id
            raise RuntimeError("episode failed")
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(container_id)


def test_removed_container_raises_closed(image, client):
    box = sandbox(image, client)
    client.containers.get(box.id).remove(force=True)
    with pytest.raises(SandboxClosedError):
        box.run("true")
    box.close()  # already gone: not an error


def test_missing_image_fails_fast_without_pulling(client):
    start = time.monotonic()
    with pytest.raises(SandboxStartError, match="never pull"):
        DockerSandbox("sao-no-such-image:v0", label=LABEL, client=client)
    assert time.monotonic() - start < 10


class _LostAnswer:
    """A client whose ``containers.create`` reaches the daemon, which makes the container, but whose answer
    is lost, as when dockerd goes down mid-request (the state a restarted daemon leaves: ``Created``)."""

    def __init__(self, client) -> None:  # type: ignore[no-untyped-def]
        self._client = client
        self.api = client.api
        self.containers = self

    def create(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        import requests

        self._client.containers.create(*args, **kwargs)
        raise requests.ConnectionError("Connection aborted: RemoteDisconnected")

    def list(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._client.containers.list(*args, **kwargs)


def test_a_container_made_by_a_create_whose_answer_was_lost_is_removed(image, client):
    label = f"{LABEL}-lost"
    try:
        with pytest.raises(SandboxStartError, match="cannot create"):
            DockerSandbox(image, label=label, client=_LostAnswer(client))
        assert containers(client, label) == [], "the container the daemon made was left behind"
    finally:
        gc(label=label, client=client)


def _child(code: str, label: str) -> subprocess.Popen:
    script = textwrap.dedent(f"""\
        import sys, time
        from sao.sandboxes import DockerSandbox, BASE_IMAGE
        sb = DockerSandbox(BASE_IMAGE, label={label!r})
        print("READY", sb.id, flush=True)
    """) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sigkilled_child(client, label: str) -> None:  # type: ignore[no-untyped-def]
    """A child that started one sandbox under ``label``, then SIGKILLed: its container is left."""
    child = _child("time.sleep(600)\n", label)
    try:
        line = child.stdout.readline()
        assert line.startswith("READY"), (line, child.stderr.read() if child.poll() is not None else "")
        child.kill()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert len(containers(client, label)) == 1  # SIGKILL: nothing ran, the container is left


def test_gc_cleans_up_after_a_sigkilled_parent(image, client):
    label = f"{LABEL}-killed"
    _sigkilled_child(client, label)
    assert gc(label=label, client=client) >= 1
    assert containers(client, label) == []


def _racing_client(removes: list[str], by):  # type: ignore[no-untyped-def]
    """A client of its own whose first container listing is followed, before the SDK inspects each
    listed container, by the removal of ``removes`` through ``by``: another process's clean-up (or a
    sandbox's owner closing it) landing between the SDK's list and inspect calls."""
    import docker

    racing = docker.from_env()
    listing = racing.api.containers

    def containers(*args, **kwargs):  # type: ignore[no-untyped-def]
        rows = listing(*args, **kwargs)
        while removes:
            by.containers.get(removes.pop()).remove(force=True)
        return rows

    racing.api.containers = containers
    return racing


def test_gc_and_the_orphan_reaper_skip_a_container_removed_between_list_and_inspect(image, client):
    """CI saw ``NotFound`` from a listing of sandboxes while another process removed one of them; the
    clean-up must remove what is left and not fail for what is already gone."""
    from sao.sandboxes.docker import OWNER_LABEL_KEY
    from sao.sandboxes.orphans import reap_orphans

    label, host = f"{LABEL}-race", f"sao-race-{uuid.uuid4().hex[:8]}"  # a host no other sandbox claims
    try:
        gone, left = (client.containers.create(image, "sleep infinity", labels={LABEL_KEY: f"{label}-gc"})
                      for _ in range(2))
        racing = _racing_client([gone.id], client)
        try:
            assert gc(label=f"{label}-gc", client=racing) == 1
        finally:
            racing.close()
        assert containers(client, f"{label}-gc") == []

        owned = {LABEL_KEY: f"{label}-orphan", OWNER_LABEL_KEY: f"{host}:1"}  # an owner on that host, dead
        gone, left = (client.containers.create(image, "sleep infinity", labels=owned) for _ in range(2))
        racing = _racing_client([gone.id], client)
        try:
            assert reap_orphans(racing, host=host, alive=lambda pid: False) == [left.name]
        finally:
            racing.close()
        assert containers(client, f"{label}-orphan") == []
    finally:
        gc(label=f"{label}-gc", client=client)
        gc(label=f"{label}-orphan", client=client)


def test_the_next_process_removes_a_sigkilled_owners_containers(image, client):
    """sao.sandboxes.orphans: the first sandbox a process starts removes this host's dead owners' containers."""
    label = f"{LABEL}-orphan"
    try:
        _sigkilled_child(client, label)
        later = _child("sb.close()\n", f"{label}-later")  # another run, under another label
        out, err = later.communicate(timeout=120)
        assert later.returncode == 0 and out.startswith("READY"), err
        assert containers(client, label) == []
        assert "left by processes that died" in err  # it says what it removed
    finally:
        gc(label=label, client=client)


def test_atexit_removes_unclosed_sandboxes(image, client):
    label = f"{LABEL}-atexit"
    child = _child("sys.exit(0)\n", label)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and out.startswith("READY"), err
    try:
        assert containers(client, label) == []
    finally:
        gc(label=label, client=client)


def test_cli_gc(image, client, capsys):
    label = f"{LABEL}-cli"
    sandbox(image, client, label=label)
    assert cli_main(["gc", "--label", label]) == 0
    assert capsys.readouterr().out.strip() == f"removed 1 sandbox container ({LABEL_KEY}={label})"
    assert containers(client, label) == []


def test_pool_of_docker_sandboxes(image, client):
    label = f"{LABEL}-pool"
    seen: list[str] = []

    async def episode(pool: SandboxPool, i: int) -> str:
        async with pool.sandbox() as box:
            seen.append(box.id)
            result = await asyncio.to_thread(box.run, f"echo episode-{i} > /tmp/mark; cat /tmp/mark; ls /tmp")
            return result.output

    async def main() -> list[str]:
        async with SandboxPool(lambda: DockerSandbox(image, label=label, client=client),
                               max_concurrent=2, warm=1) as pool:
            return await asyncio.gather(*(episode(pool, i) for i in range(3)))

    outputs = asyncio.run(main())
    assert outputs == [f"episode-{i}\nmark\n" for i in range(3)]  # fresh /tmp each time: no leaked state
    assert len(set(seen)) == 3
    assert containers(client, label) == []
