"""LocalSandbox (bubblewrap and plain subprocess), the output rules, the fake, and SandboxPool.

The bubblewrap variants skip with a reason where ``bwrap`` is missing or cannot create
namespaces; the plain variants always run.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from sao.sandboxes import (
    DockerUnavailableError,
    ExecResult,
    FakeSandbox,
    FakeSandboxFactory,
    LocalSandbox,
    Sandbox,
    SandboxClosedError,
    SandboxLimits,
    SandboxPathError,
    SandboxPool,
    bwrap_usable,
    gc,
)
from sao.sandboxes.base import OutputBuffer
from sao.sandboxes.cli import main as cli_main


@pytest.fixture(params=["bwrap", "plain"])
def mode(request) -> str:
    if request.param == "bwrap" and not bwrap_usable():
        pytest.skip("bubblewrap is not installed or cannot create namespaces here (apt-get install -y bubblewrap)")
    return request.param


def local(mode: str, **kw) -> LocalSandbox:
    return LocalSandbox(use_bwrap=mode == "bwrap", **kw)


def host_processes(needle: str) -> list[str]:
    """Command lines of live (non-zombie) processes on this machine that contain ``needle``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            found.append(cmdline)
    return found


def unique_sleep() -> str:
    """A sleep duration no other process on the machine uses, to find our own sleeps."""
    return f"{random.randint(2000, 9000)}.{random.randint(100, 999)}"


# -- LocalSandbox --------------------------------------------------------------------------------


def test_local_run_output_exit_code_env_and_workdir(mode):
    with local(mode) as sb:
        assert isinstance(sb, Sandbox)
        result = sb.run("echo out; echo err >&2; exit 4")
        assert result.exit_code == 4 and "out\n" in result.output and "err\n" in result.output
        sb.write_file("sub/x.txt", "x")
        result = sb.run('pwd; echo "$WHO"; echo "${OPENAI_API_KEY:-unset}"', workdir="sub", env={"WHO": "me"})
        assert result.output.splitlines() == [str(sb.root / "sub"), "me", "unset"]  # caller's env does not leak
        assert sb.run("kill -9 $$").exit_code == 137


def test_local_timeout_kills_the_process_group(mode):
    d = unique_sleep()
    with local(mode) as sb:
        start = time.monotonic()
        result = sb.run(f"echo started; sleep {d} & setsid sleep {d} & sleep {d}", timeout_s=1)
        assert time.monotonic() - start < 5
        assert result.timed_out and result.exit_code == 124 and result.output.startswith("started\n")
        assert result.output.endswith("\n[... command timed out after 1 s and was killed ...]\n")
        time.sleep(0.2)
        assert host_processes(f"sleep {d}") == []


def test_local_background_processes_do_not_outlive_run(mode):
    d = unique_sleep()
    with local(mode) as sb:
        start = time.monotonic()
        result = sb.run(f"sleep {d} & echo launched")
        assert result.output == "launched\n" and time.monotonic() - start < 3
        time.sleep(0.2)
        assert host_processes(f"sleep {d}") == []


def test_local_memory_limit(mode):
    with local(mode, limits=SandboxLimits(memory_mb=256)) as sb:
        result = sb.run("python3 -c \"x = b'x' * (1024 * 1024 * 1024); print('allocated')\"", timeout_s=30)
        assert result.exit_code != 0 and "MemoryError" in result.output and "allocated" not in result.output


def test_local_output_truncation_and_binary_output(mode):
    with local(mode, limits=SandboxLimits(output_limit_bytes=1000)) as sb:
        result = sb.run("seq 1 100000")
        assert result.truncated and result.output.startswith("1\n2\n") and result.output.endswith("100000\n")
        assert "bytes omitted ...]" in result.output
        binary = sb.run("head -c 100000 /dev/urandom")
        assert binary.exit_code == 0 and binary.truncated
        assert sb.run(r"printf 'a\377b'").output == "a\ufffdb"


def test_local_file_api_and_escapes(mode, tmp_path):
    with local(mode) as sb:
        sb.write_file("a/b/c.bin", bytes(range(256)))
        sb.write_file(str(sb.root / "a" / "run.sh"), "echo hi\n", mode=0o755)
        assert sb.read_file("a/b/c.bin") == bytes(range(256))
        assert sb.list_dir("a") == ["b", "run.sh"]
        assert sb.run("./a/run.sh").output == "hi\n"
        assert os.stat(sb.root / "a" / "run.sh").st_mode & 0o777 == 0o755
        with pytest.raises(FileNotFoundError):
            sb.read_file("nope")
        for bad in ("../escape.txt", "a/../../escape.txt", "/etc/passwd", str(tmp_path / "x")):
            with pytest.raises(SandboxPathError):
                sb.write_file(bad, "x")
            with pytest.raises(SandboxPathError):
                sb.read_file(bad)
        sb.run(f"ln -s {tmp_path} out")  # a symlink pointing out of the root
        with pytest.raises(SandboxPathError):
            sb.write_file("out/evil.txt", "x")
        with pytest.raises(SandboxPathError):
            sb.list_dir("out")
        with pytest.raises(SandboxPathError):
            sb.run("true", workdir="..")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path.parent / "escape.txt").exists()


def test_local_close_removes_its_directory_and_blocks_use(mode, tmp_path):
    sb = local(mode)
    root = sb.root
    sb.write_file("f", "x")
    sb.close()
    sb.close()
    assert not root.exists()
    with pytest.raises(SandboxClosedError):
        sb.run("true")
    with pytest.raises(SandboxClosedError):
        sb.read_file("f")
    kept = LocalSandbox(root=tmp_path / "given", use_bwrap=mode == "bwrap")
    kept.write_file("f", "x")
    kept.close()
    assert (tmp_path / "given" / "f").read_text() == "x"  # a given root is the caller's


def test_bwrap_isolation():
    if not bwrap_usable():
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    with LocalSandbox(use_bwrap=True) as sb:
        assert sb.isolated
        assert sb.run("touch /usr/sao-should-fail").exit_code != 0  # the host is read-only
        assert sb.run("echo kept > /tmp/state; cat /proc/1/cmdline | tr '\\0' ' '").exit_code == 0
        assert sb.run("cat /tmp/state").output == "kept\n"  # private /tmp lasts as long as the sandbox
        assert not Path("/tmp/state").exists() or Path("/tmp/state").read_text() != "kept\n"
        probe = sb.run("python3 -c \"import socket; s = socket.socket(); s.settimeout(2); "
                       "s.connect(('1.1.1.1', 53))\" 2>&1 | tail -1")
        assert "unreachable" in probe.output.lower() or "error" in probe.output.lower(), probe


def test_without_bubblewrap_the_default_local_sandbox_refuses_unless_unisolated_is_asked_for(monkeypatch):
    """A model's code never runs unisolated by default: without a usable bwrap, LocalSandbox() and a math
    environment with the python tool on the local sandbox raise, saying what to do; SAO_SANDBOX_UNISOLATED=1
    (or use_bwrap=False in code) is the explicit opt-in to plain subprocesses."""
    import sao.sandboxes.local as local_module
    from sao.envs.arithmetic import ArithmeticTasks
    from sao.envs.math_envs import MathEnv
    from sao.sandboxes import UNISOLATED_VAR, SandboxStartError

    monkeypatch.setattr(local_module, "bwrap_usable", lambda: False)
    monkeypatch.delenv(UNISOLATED_VAR, raising=False)
    with pytest.raises(SandboxStartError, match="bubblewrap") as refused:
        LocalSandbox()
    assert UNISOLATED_VAR in str(refused.value) and "sandbox=docker" in str(refused.value)
    with pytest.raises(SandboxStartError, match=UNISOLATED_VAR):
        MathEnv(ArithmeticTasks(), tools="python")
    MathEnv(ArithmeticTasks())  # no tool, no sandbox needed
    MathEnv(ArithmeticTasks(), tools="python", sandbox="docker")  # the Docker sandbox isolates on its own
    with LocalSandbox(use_bwrap=False) as plain:
        assert not plain.isolated

    monkeypatch.setenv(UNISOLATED_VAR, "1")
    with LocalSandbox() as sb:
        assert not sb.isolated and sb.run("echo hi").output == "hi\n"
    monkeypatch.setattr(local_module, "bwrap_usable", lambda: True)
    monkeypatch.delenv(UNISOLATED_VAR)
    assert local_module.require_isolation() is True


# -- records and output rules -------------------------------------------------------------------


def test_output_buffer_keeps_head_and_tail_and_strips_the_sentinel():
    buf = OutputBuffer(300, suffix=b"#END#")
    data = bytes(i % 251 for i in range(10_000))
    for i in range(0, len(data), 77):
        buf.add(data[i:i + 77])
    buf.add(b"#END#")
    text, truncated, seen = buf.finish()
    # 10,000 bytes shown as 150 head + 150 tail -> 9,700 omitted; the sentinel is not output.
    expected = (data[:150].decode(errors="replace") + "\n[... output truncated: 9700 bytes omitted ...]\n"
                + data[-150:].decode(errors="replace"))
    assert truncated and seen and text == expected
    small = OutputBuffer(300)
    small.add(b"short")
    assert small.finish() == ("short", False, False)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits().timeout_for(0)
    assert SandboxLimits(default_timeout_s=5).timeout_for(None) == 5
    assert ExecResult(exit_code=0, output="").ok and not ExecResult(exit_code=124, output="", timed_out=True).ok


def test_docker_unavailable_says_how_to_start_it(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(DockerUnavailableError, match="dockerd"):
        gc(label="x")
    assert cli_main(["gc"]) == 2
    assert "dockerd" in capsys.readouterr().err


# -- the fake -------------------------------------------------------------------------------------


def test_fake_sandbox_is_scripted_and_records():
    sb = FakeSandbox({"ls": "a\nb\n", "false": ExecResult(exit_code=1, output="")}, files={"/w/x.txt": "hi"})
    assert isinstance(sb, Sandbox)
    assert sb.run("ls").output == "a\nb\n" and sb.run("false").exit_code == 1
    assert sb.run("vim").exit_code == 127
    assert sb.commands == ["ls", "false", "vim"]
    assert sb.read_file("/w/x.txt") == b"hi" and sb.list_dir("/w") == ["x.txt"]
    with pytest.raises(FileNotFoundError):
        sb.read_file("/w/y")
    sb.close()
    with pytest.raises(SandboxClosedError):
        sb.run("ls")


# -- the pool ------------------------------------------------------------------------------------


def test_pool_bounds_concurrency_and_closes_everything():
    factory = FakeSandboxFactory(start_delay_s=0.01)
    handed: list[int] = []
    live = 0
    peak = 0

    async def episode(pool: SandboxPool) -> None:
        nonlocal live, peak
        async with pool.sandbox() as sb:
            handed.append(id(sb))
            live += 1
            peak = max(peak, live)
            await asyncio.sleep(0.02)
            assert not sb.closed
            live -= 1
        assert sb.closed  # returned sandboxes are closed, never reused

    async def main() -> None:
        pool = SandboxPool(factory, max_concurrent=3)
        await asyncio.gather(*(episode(pool) for _ in range(12)))
        await pool.close()

    asyncio.run(main())
    assert peak == 3 and factory.max_open <= 3
    assert len(factory.created) == 12 and len(set(handed)) == 12
    assert factory.open_count == 0


def test_pool_keeps_warm_sandboxes_ready():
    factory = FakeSandboxFactory(start_delay_s=0.01)

    async def main() -> None:
        async with SandboxPool(factory, max_concurrent=2, warm=2) as pool:
            assert len(factory.created) == 2 and pool.ready == 2 and pool.in_use == 0  # pre-started
            first = factory.created[0]
            async with pool.sandbox() as sb:
                assert sb is first  # handed out without waiting for a start
                await asyncio.sleep(0.1)  # the pool starts a replacement in the background
                assert pool.ready == 2 and len(factory.created) == 3
            assert first.closed
            await asyncio.sleep(0.1)
            assert pool.ready == 2 and factory.open_count == 2
            ids = []

            async def grab() -> None:
                async with pool.sandbox() as sb:
                    ids.append(id(sb))
                    await asyncio.sleep(0.01)

            await asyncio.gather(*(grab() for _ in range(6)))
            assert len(set(ids)) == 6
        assert factory.open_count == 0  # close() closed the idle warm ones
        assert factory.max_open <= 2 + 2

    asyncio.run(main())


def test_pool_start_failure_reaches_the_episode_and_frees_the_slot():
    factory = FakeSandboxFactory(fail_after=1, start_error=RuntimeError("no container for you"))

    async def main() -> None:
        pool = SandboxPool(factory, max_concurrent=1)
        async with pool.sandbox():
            pass
        with pytest.raises(RuntimeError, match="no container"):
            async with pool.sandbox():
                pass
        factory.fail_after = None
        async with pool.sandbox() as sb:  # the slot was released
            assert not sb.closed
        await pool.close()
        with pytest.raises(SandboxClosedError):
            async with pool.sandbox():
                pass

    asyncio.run(asyncio.wait_for(main(), timeout=10))


def test_pool_with_local_sandboxes():
    async def main() -> list[str]:
        async with SandboxPool(lambda: LocalSandbox(use_bwrap=False), max_concurrent=2, warm=1) as pool:

            async def episode(i: int) -> str:
                async with pool.sandbox() as sb:
                    result = await asyncio.to_thread(sb.run, f"ls; echo {i} > mine")
                    return result.output

            return await asyncio.gather(*(episode(i) for i in range(4)))

    assert asyncio.run(main()) == [""] * 4  # every episode starts from an empty root
