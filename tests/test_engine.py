"""The managed vLLM server and its control client, against a real vLLM (CPU) with SmolLM2-135M.

Start-up costs about 45 s on 2 cores once torch.compile's cache is warm (the very first start
compiles for 2 minutes more), so the session's shared server serves every API test; the two stop
tests each start their own server in a child script, because what they check (SIGTERM, and
SIGKILL of the parent) cannot happen to the shared one.

Skipped when vllm is not installed or the model is not prepared (``sao-model prepare
smollm2-135m``), unless ``SAO_REQUIRE_VLLM=1``: then a missing vllm fails, and the model is
prepared on demand.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

import sao.agents.engine.server as engine_mod
from sao.agents.engine.control import EngineClient
from sao.agents.engine.server import VLLMServer, VLLMServerConfig, free_port
from sao.agents.errors import EngineError, EngineStartError
from sao.agents.models.prepare import is_prepared, prepare_model, resolve_model
from tests.faults.procs import no_compile_env

ALIAS = "smollm2-135m"
# "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n" in SmolLM2's tokenizer.
PROMPT_IDS = [1, 4093, 198, 1780, 314, 216, 33, 34, 1232, 216, 35, 32, 47, 2, 198, 1, 520, 9531, 198]
EOS_ID = 2  # <|im_end|>


def _required() -> bool:
    return os.environ.get("SAO_REQUIRE_VLLM") == "1"


def require_vllm_installed() -> None:
    if importlib.util.find_spec("vllm") is None:
        if _required():
            pytest.fail("SAO_REQUIRE_VLLM=1 but vllm is not installed (pip install -e '.[cpu]')")
        pytest.skip("vllm is not installed (pip install -e '.[cpu]'); SAO_REQUIRE_VLLM=1 makes this a failure")


def require_vllm() -> str:
    """The prepared model's directory, or a skip (a failure under ``SAO_REQUIRE_VLLM=1``)."""
    require_vllm_installed()
    if not is_prepared(ALIAS):
        if _required():
            return str(prepare_model(ALIAS))
        pytest.skip(f"model not prepared: run `sao-model prepare {ALIAS}` (SAO_REQUIRE_VLLM=1 prepares it)")
    return resolve_model(ALIAS)


def _alive(pids: set[int]) -> set[int]:
    import psutil

    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _tree(pid: int) -> set[int]:
    import psutil

    return {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}


# --------------------------------------------------------------------------- without a server


def test_auto_dtype_serves_bfloat16_only_where_the_hardware_computes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A managed engine's default dtype: bfloat16 on a GPU or a CPU with AMX / AVX-512 BF16, float32 on any
    other CPU (vLLM emulates bfloat16 there, far slower); a dtype given is passed as is."""
    from sao.agents.engine.server import serving_dtype

    avx2 = frozenset({"fma", "avx2", "avx"})
    assert serving_dtype("auto", cuda=False, flags=avx2) == "float32"
    assert serving_dtype("auto", cuda=False, flags=avx2 | {"avx512f", "avx512_bf16"}) == "bfloat16"
    assert serving_dtype("auto", cuda=False, flags=avx2 | {"amx_tile", "amx_bf16"}) == "bfloat16"
    assert serving_dtype("auto", cuda=True, flags=avx2) == "bfloat16"
    assert serving_dtype("bfloat16", cuda=False, flags=avx2) == "bfloat16"  # asked for: as is
    assert serving_dtype("float32", cuda=True, flags=avx2) == "float32"
    cmd = VLLMServerConfig(model="/m").command(1)
    assert cmd[cmd.index("--dtype") + 1] == serving_dtype("auto")  # this machine's
    assert not Path("/proc/cpuinfo").is_file() or engine_mod.cpu_flags()  # read from /proc/cpuinfo here
    monkeypatch.setattr(engine_mod, "cpu_flags", lambda: avx2)
    monkeypatch.setattr(engine_mod, "_cuda_present", lambda: False)
    assert VLLMServerConfig(model="/m").command(1)[cmd.index("--dtype") + 1] == "float32"
    assert VLLMServerConfig(model="/m", dtype="bfloat16").command(1)[cmd.index("--dtype") + 1] == "bfloat16"


def test_config_and_client_validate_their_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAO_VLLM_ARGS", raising=False)
    with pytest.raises(ValueError, match="kv_cache_gib"):
        VLLMServerConfig(model="m", kv_cache_gib=1.5)  # type: ignore[arg-type]
    assert VLLMServerConfig(model="m", kv_cache_gib=1.0).environment()["VLLM_CPU_KVCACHE_SPACE"] == "1"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="port"):
        VLLMServerConfig(model="m", port=70000)
    cmd = VLLMServerConfig(model="/m", served_model_name="p", extra_args=("--seed", "1")).command(1234)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--port") + 1] == "1234" and cmd[-2:] == ["--seed", "1"]
    assert "--gpu-memory-utilization" not in VLLMServerConfig(model="m").command(1)
    env = VLLMServerConfig(model="m", kv_cache_gib=3, env={"X": "1"}).environment()
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["X"] == "1"
    with pytest.raises(ValueError, match="without /v1"):
        EngineClient("http://127.0.0.1:8000/v1")
    # $SAO_VLLM_ARGS reaches every managed engine, after the config's own arguments
    monkeypatch.setenv("SAO_VLLM_ARGS", "-O0 --seed '2'")
    cmd = VLLMServerConfig(model="/m", extra_args=("--seed", "1")).command(1)
    assert cmd[-5:] == ["--seed", "1", "-O0", "--seed", "2"]


def test_health_is_false_and_calls_fail_when_nothing_listens() -> None:
    async def go() -> tuple[bool, EngineError]:
        async with EngineClient(f"http://127.0.0.1:{free_port()}") as client:
            with pytest.raises(EngineError, match="no answer") as err:
                await client.is_paused()
            return await client.health(), err.value

    healthy, err = asyncio.run(go())
    assert healthy is False and err.status_code is None


_FAMILY = textwrap.dedent(
    """
    import subprocess, sys, time
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    subprocess.Popen(sleep)  # stays in the group, like vLLM's EngineCore
    subprocess.Popen(sleep, start_new_session=True)  # leaves it
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_stop_after_the_servers_own_death_still_ends_its_children() -> None:
    # A SIGKILLed API server leaves vLLM's EngineCore running (issue 14: about 2 minutes). The tree recorded
    # while the server lived lets stop() end them all, the one that left the process group too.
    from sao.agents.engine import server as engine

    proc = subprocess.Popen([sys.executable, "-c", _FAMILY], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    children = engine._descendants(proc.pid)
    try:
        assert len(children) == 2
        proc.kill()  # the server dies; its children are no longer its children
        proc.wait(timeout=10)
        assert engine._descendants(proc.pid) == [] and all(engine._running(p) for p in children)
        engine._terminate_tree(proc, grace_s=5.0, known=children)
        assert not any(engine._running(p) for p in children)
    finally:
        for p in children:
            if engine._running(p):
                p.kill()


@pytest.mark.vllm
def test_start_failure_reports_the_log_tail(tmp_path: Path) -> None:
    require_vllm_installed()
    config = VLLMServerConfig(model=str(tmp_path), extra_args=("--no-such-flag",), log_path=tmp_path / "s.log")
    server = VLLMServer(config)
    with pytest.raises(EngineStartError, match="exited with code") as err:
        server.start()
    assert "--no-such-flag" in err.value.log_tail and err.value.log_path == tmp_path / "s.log"
    assert server.pid is None and not server.running


@pytest.mark.vllm
def test_start_timeout_stops_what_was_started(tmp_path: Path) -> None:
    require_vllm_installed()
    port = free_port()
    config = VLLMServerConfig(model=str(tmp_path), port=port, startup_timeout_s=3.0, log_path=tmp_path / "s.log")
    server = VLLMServer(config)
    # Another test's server (a session fixture) may hold the guard: compare with the state before.
    handler_before, users_before = signal.getsignal(signal.SIGTERM), engine_mod._SIGTERM_GUARD._users
    with pytest.raises(EngineStartError, match="not healthy after 3 s"):
        server.start()
    assert not _vllm_pids_on_port(port) and not server.running
    # the failed start gave back its hold on the SIGTERM guard
    assert engine_mod._SIGTERM_GUARD._users == users_before
    assert signal.getsignal(signal.SIGTERM) is handler_before


# --------------------------------------------------------------------------- clean stop


_STOP_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from sao.agents.engine.server import VLLMServer, VLLMServerConfig

    model, port, ready = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    config = VLLMServerConfig(model=model, port=port, max_model_len=2048, kv_cache_gib=1,
                              log_path=ready.with_suffix(".log"))
    with VLLMServer(config) as server:
        ready.write_text(json.dumps({"pid": server.pid}))
        while True:
            time.sleep(1)
    """
)


def _vllm_pids_on_port(port: int) -> set[int]:
    import psutil

    found = set()
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if "--port" in cmdline and str(port) in cmdline and any("vllm" in part for part in cmdline):
            found.add(p.pid)
    return found


def _start_scripted_server(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, set[int]]:
    """Run the stop script; return it, the server's port, and every pid of the server's tree."""
    model = require_vllm()
    script, ready, port = tmp_path / "serve.py", tmp_path / "ready.json", free_port()
    script.write_text(_STOP_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), model, str(port), str(ready)], env=no_compile_env())
    deadline = time.monotonic() + 600
    while not ready.exists():
        if proc.poll() is not None:
            pytest.fail(f"the server script exited with {proc.returncode}; log:\n{_tail(ready.with_suffix('.log'))}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the server script did not report a healthy server in 600 s")
        time.sleep(0.5)
    server_pid = json.loads(ready.read_text())["pid"]
    pids = _tree(server_pid) | _vllm_pids_on_port(port)
    assert len(pids) >= 2, "expected vLLM's API server and its engine-core process"
    return proc, port, pids


def _assert_all_gone(pids: set[int], port: int, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while (_alive(pids) or _vllm_pids_on_port(port)) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = _alive(pids) | _vllm_pids_on_port(port)
    for pid in survivors:  # ours, started by this test: do not leak them into the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not survivors, f"vLLM processes survived {within_s:.0f} s: {sorted(survivors)}"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.long
def test_sigterm_to_the_parent_stops_the_server_tree(tmp_path: Path) -> None:
    proc, port, pids = _start_scripted_server(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM  # SystemExit from the installed handler
    _assert_all_gone(pids, port)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.long
def test_sigkill_of_the_parent_stops_the_server_tree(tmp_path: Path) -> None:
    proc, port, pids = _start_scripted_server(tmp_path)
    proc.kill()  # no handler, no atexit: only PR_SET_PDEATHSIG is left to save us
    proc.wait(timeout=10)
    _assert_all_gone(pids, port)


# --------------------------------------------------------------------------- one shared server


@pytest.fixture(scope="module")
def server(vllm_server: VLLMServer) -> VLLMServer:
    """The session's shared server (tests/conftest.py), which also checks that stop() leaves no process."""
    return vllm_server


def _run(coro_fn, server: VLLMServer):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        async with EngineClient(server.root_url) as client:
            return await coro_fn(client)

    return asyncio.run(go())


def _completion(server: VLLMServer, **extra: object) -> dict:
    body = {"model": server.model_name, "prompt": PROMPT_IDS, "temperature": 0, "return_token_ids": True}
    body.update(extra)
    resp = httpx.post(f"{server.base_url}/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _prompt_logprobs(server: VLLMServer) -> list[float]:
    """Log-probs of each prompt token given its prefix, plus that of the greedy next token."""
    choice = _completion(server, max_tokens=1, logprobs=1, prompt_logprobs=1)["choices"][0]
    per_position = choice["prompt_logprobs"][1:]  # the first token has no prefix
    values = [entry[str(tok)]["logprob"] for tok, entry in zip(PROMPT_IDS[1:], per_position, strict=True)]
    return values + [choice["logprobs"]["token_logprobs"][0]]


@pytest.mark.vllm
def test_urls_and_health(server: VLLMServer) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    assert server.root_url == f"http://127.0.0.1:{server.port}"
    assert server.running and server.log_path.is_file()
    models = httpx.get(f"{server.base_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [server.model_name]
    assert _run(lambda c: c.health(), server) is True


@pytest.mark.vllm
def test_pause_and_resume(server: VLLMServer) -> None:
    async def go(client: EngineClient) -> list[bool]:
        seen = [await client.is_paused()]
        await client.pause()
        seen.append(await client.is_paused())
        await client.resume()
        seen.append(await client.is_paused())
        await client.pause(mode="keep")
        seen.append(await client.is_paused())
        await client.resume()
        return seen

    assert _run(go, server) == [False, True, False, True]


@pytest.mark.vllm
def test_weight_version_round_trip(server: VLLMServer) -> None:
    async def go(client: EngineClient) -> list[str | None]:
        await client.set_weight_version(3)
        first = await client.weight_version()
        await client.set_weight_version("step-4")
        return [first, await client.weight_version()]

    assert _run(go, server) == ["3", "step-4"]


@pytest.mark.vllm
def test_reset_prefix_cache(server: VLLMServer) -> None:
    _completion(server, max_tokens=1)  # something in the cache
    assert _run(lambda c: c.reset_prefix_cache(), server) is True


@pytest.mark.vllm
def test_errors_carry_status_and_body(server: VLLMServer) -> None:
    async def go(client: EngineClient) -> EngineError:
        with pytest.raises(EngineError) as err:
            await client._call("POST", "/collective_rpc", json={"no": "method"})
        return err.value

    err = _run(go, server)
    assert err.status_code == 400 and "method" in (err.body or "")


@pytest.mark.vllm
@pytest.mark.part("vllm-generation")
def test_completion_returns_token_ids_through_eos(server: VLLMServer) -> None:
    """The contract the token-in/token-out client relies on (printed for reference with -s). The EOS
    is forced (a +100 logit bias), so the test does not depend on what the model would have said:
    greedy decoding of this prompt ran past 64 tokens on one engine dtype and not on another."""
    data = _completion(server, max_tokens=64, logprobs=1, logit_bias={str(EOS_ID): 100})
    print(json.dumps(data))
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None  # EOS, not a stop string
    assert choice["token_ids"][-1] == EOS_ID  # the EOS token is included in token_ids ...
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])  # ... and has a log-prob
    assert choice["prompt_token_ids"] == PROMPT_IDS
    assert "weight_version" not in json.dumps(data)  # vLLM 0.32 does not report it here


@pytest.mark.vllm
@pytest.mark.part("vllm-weight-sync")
def test_reload_weights_changes_and_restores_logprobs(server: VLLMServer, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    original = Path(server.config.model)
    modified = tmp_path / "modified"
    shutil.copytree(original, modified, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(original / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 0.5  # halves every logit: flatter
    save_file(tensors, modified / "model.safetensors", metadata={"format": "pt"})

    async def reload(client: EngineClient, path: Path, version: str) -> float:
        # The RL sequence: pause, swap weights, drop KV computed with the old ones, label, resume.
        started = time.monotonic()
        await client.pause(mode="keep")
        await client.reload_weights(path)
        assert await client.reset_prefix_cache()
        await client.set_weight_version(version)
        await client.resume()
        return time.monotonic() - started

    before = _prompt_logprobs(server)
    try:
        seconds = _run(lambda c: reload(c, modified, "modified"), server)
        print(f"\nreload_weights (pause..resume): {seconds:.2f} s")
        after = _prompt_logprobs(server)
    finally:
        _run(lambda c: reload(c, original, "original"), server)
    restored = _prompt_logprobs(server)

    assert max(abs(a - b) for a, b in zip(before, after)) > 0.1
    # Same weights, same request, same batch shape: bf16 on the CPU reproduces to rounding noise.
    assert max(abs(a - b) for a, b in zip(before, restored)) < 1e-3
    assert _run(lambda c: c.weight_version(), server) == "original"
