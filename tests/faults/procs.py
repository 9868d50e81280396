"""Process and file helpers of the fault tests: the vLLM processes under a process, JSONL files."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SAO_TRAIN = str(Path(sys.executable).with_name("sao-train"))
SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))
API_SERVER = "vllm.entrypoints.openai.api_server"


def vllm_processes(root: int) -> dict[int, Any]:
    """The vLLM processes under ``root`` (API server, EngineCore, workers), by pid, as psutil processes."""
    import psutil

    try:
        tree = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return {}
    found = {}
    for p in tree:
        try:
            if "vllm" in " ".join(p.cmdline()).lower() or p.name().startswith("VLLM"):
                found[p.pid] = p
        except psutil.Error:
            pass
    return found


def running(p: Any) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def api_server(processes: dict[int, Any]) -> int:
    """The pid of the vLLM API server among ``processes``."""
    for pid, p in processes.items():
        with contextlib.suppress(Exception):
            if API_SERVER in " ".join(p.cmdline()):
                return pid
    raise AssertionError(f"no vLLM API server among {sorted(processes)}")


def reap_and_assert_gone(processes: dict[int, Any], within_s: float, what: str) -> None:
    """Wait up to ``within_s`` for ``processes`` to end; kill the ones left (ours: they must not leak into
    the next test) and fail naming them."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(running(p) for p in processes.values()):
        time.sleep(0.5)
    left = {pid: p for pid, p in processes.items() if running(p)}
    names = {}
    for pid, p in left.items():
        with contextlib.suppress(Exception):
            names[pid] = p.name()
        with contextlib.suppress(Exception):
            p.kill()
    assert not left, f"vLLM processes outlived {what} by {within_s:.0f} s: {names}"


def count_lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text(encoding="utf-8").split("\n") if line.strip())
    except OSError:
        return 0


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def wait_for(what: str, predicate: Any, proc: subprocess.Popen, log: Path, timeout_s: float = 900) -> None:
    """Poll ``predicate()`` until true; fail if ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before {what}; log:\n{tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout_s:.0f} s; log:\n{tail(log)}")
        time.sleep(0.2)


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def stop(proc: subprocess.Popen) -> None:
    """Kill a run this test started, with its managed engines (a finally clause)."""
    if proc.poll() is None:
        tree = vllm_processes(proc.pid)
        proc.kill()
        proc.wait(timeout=30)
        for p in tree.values():
            with contextlib.suppress(Exception):
                p.kill()


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``path`` for the block (a full file system on demand); skips when
    mounting is not permitted here (CI runs as root)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a small file system to fill) needs root; CI runs as root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"mount -t tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path, leave: int = 0) -> None:
    """Write ``path`` until its file system is full, then give back ``leave`` bytes."""
    chunk = b"\0" * 2**20
    with open(path, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError:
            pass
    if leave:
        size = path.stat().st_size
        os.truncate(path, max(0, size - leave))


def no_compile_env() -> dict[str, str]:
    """This process's environment with ``SAO_VLLM_ARGS=-O0`` (agents/engine/server.py ``env_args``): the managed
    vLLMs of a child started with it skip torch.compile. For engines started only to be stopped,
    killed or restarted, whose start it shortens."""
    from sao.agents.engine.server import ENV_ARGS

    return {**os.environ, ENV_ARGS: "-O0"}
