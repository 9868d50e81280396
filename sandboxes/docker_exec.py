"""Commands in a sandbox's container, through the exec API: the kill wrapper, the client's own deadline,
exit codes, and the short helper commands (see :mod:`sao.sandboxes.docker` for the kill rules)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .base import TIMEOUT_EXIT_CODE, ExecResult, OutputBuffer, timeout_marker
from .errors import SandboxClosedError, SandboxError

log = logging.getLogger(__name__)

_SENTINEL = "__SAO_TIMEOUT_{}__"

# Kills every process (but the caller) whose environment holds SAO_RUN_ID=$id, until none is left.
_KILL_TAGGED = r"""
kill_tagged() {
    n=0
    while [ "$n" -lt 50 ]; do
        pids=
        for f in $(grep -lsxzF "SAO_RUN_ID=$1" /proc/[0-9]*/environ 2>/dev/null); do
            p=${f#/proc/}; p=${p%/environ}
            [ "$p" = "$$" ] || pids="$pids $p"
        done
        [ -z "$pids" ] && return 0
        kill -KILL $pids 2>/dev/null
        n=$((n + 1))
    done
}
"""

# argv: $1 run id, $2 time limit in seconds, $3 working directory, $4 the command.
_WRAPPER = _KILL_TAGGED + r"""
id=$1 limit=$2 wd=$3 cmd=$4
cd -- "$wd" || exit 126
expired=
trap 'expired=1' USR1
SAO_RUN_ID=$id setsid sh -c "$cmd" &
child=$!
( SAO_RUN_ID=$id sleep "$limit" && kill -USR1 $$ ) </dev/null >/dev/null 2>&1 &
wait "$child"
rc=$?
if [ -n "$expired" ]; then
    kill -KILL "-$child" 2>/dev/null
    kill_tagged "$id"
    wait "$child" 2>/dev/null
    printf '__SAO_TIMEOUT_%s__' "$id"
    exit 124
fi
trap '' USR1
kill -KILL "-$child" 2>/dev/null
kill_tagged "$id"
exit "$rc"
"""

_KILL_RUN = _KILL_TAGGED + r"""
kill_tagged "$1"
"""


def raise_if_gone(exc: BaseException, name: str) -> None:
    """Turn 'no such container' / 'container is not running' into SandboxClosedError."""
    import docker.errors

    text = str(exc).lower()
    gone = isinstance(exc, docker.errors.NotFound) and "no such container" in text
    stopped = isinstance(exc, docker.errors.APIError) and "is not running" in text
    if gone or stopped:
        raise SandboxClosedError(f"sandbox {name}: its container is gone or stopped ({exc})") from exc


class ContainerExec:
    """The exec API of one sandbox's container. ``check_open`` raises once the sandbox is closed."""

    def __init__(self, client: Any, container_id: str, name: str, check_open: Callable[[], None]):
        self._client = client
        self._container_id = container_id
        self.name = name
        self._check_open = check_open

    def run(self, command: str, *, limit: float, cwd: str, env: Mapping[str, str] | None, output_limit_bytes: int,
            client_grace_s: float, kill_grace_s: float) -> ExecResult:
        """``command`` in the kill wrapper, at most ``limit`` seconds; the exec is cut from outside when it
        has not returned ``client_grace_s`` past that, and its stream closed ``kill_grace_s`` later."""
        run_id = uuid.uuid4().hex
        sentinel = _SENTINEL.format(run_id).encode()
        argv = ["sh", "-c", _WRAPPER, "sao-run", run_id, f"{limit:.3f}", cwd, command]
        started = time.monotonic()
        exec_id = self.create(argv, env)
        buffer = OutputBuffer(output_limit_bytes, suffix=sentinel)
        state: dict[str, Any] = {}

        def pump() -> None:
            try:
                stream = self._client.api.exec_start(exec_id, stream=True, demux=False)
                state["stream"] = stream
                for chunk in stream:
                    buffer.add(chunk)
            except Exception as exc:  # noqa: BLE001 - reported to the caller below
                state["error"] = exc

        reader = threading.Thread(target=pump, name=f"{self.name}-exec", daemon=True)
        reader.start()
        reader.join(limit + client_grace_s)
        client_timeout = reader.is_alive()
        if client_timeout:
            log.warning("sandbox %s: exec did not return %.0f s after its %.1f s limit; killing it from outside",
                        self.name, client_grace_s, limit)
            self.kill_run(run_id)
            reader.join(kill_grace_s)
            if reader.is_alive() and "stream" in state:
                try:
                    state["stream"].close()
                except Exception:  # noqa: BLE001
                    pass
                reader.join(1.0)
        if "error" in state and not client_timeout:
            raise_if_gone(state["error"], self.name)
            raise SandboxError(f"sandbox {self.name}: exec failed: {state['error']}") from state["error"]
        text, truncated, wrapper_timeout = buffer.finish()
        timed_out = client_timeout or wrapper_timeout
        if timed_out:
            exit_code = TIMEOUT_EXIT_CODE
            text += timeout_marker(limit)
        else:
            exit_code = self.exit_code(exec_id)
        return ExecResult(exit_code=exit_code, output=text, timed_out=timed_out, truncated=truncated,
                          duration_s=time.monotonic() - started)

    def create(self, argv: list[str], env: Mapping[str, str] | None) -> str:
        self._check_open()
        try:
            return self._client.api.exec_create(self._container_id, argv, stdout=True, stderr=True, stdin=False,
                                                tty=False, environment=dict(env) if env else None)["Id"]
        except Exception as exc:  # noqa: BLE001
            raise_if_gone(exc, self.name)
            raise SandboxError(f"sandbox {self.name}: cannot start a command: {exc}") from exc

    def exit_code(self, exec_id: str) -> int:
        # The stream can end a moment before the daemon records the exit code.
        for _ in range(50):
            try:
                info = self._client.api.exec_inspect(exec_id)
            except Exception as exc:  # noqa: BLE001
                raise_if_gone(exc, self.name)
                raise SandboxError(f"sandbox {self.name}: cannot inspect a command: {exc}") from exc
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        raise SandboxError(f"sandbox {self.name}: the daemon did not report the command's exit code")

    def short(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        """A short helper command (no wrapper, no time limit): ``(exit_code, stdout, stderr)``."""
        exec_id = self.create(argv, None)
        try:
            out, err = self._client.api.exec_start(exec_id, stream=False, demux=True)
        except Exception as exc:  # noqa: BLE001
            raise_if_gone(exc, self.name)
            raise SandboxError(f"sandbox {self.name}: exec failed: {exc}") from exc
        return self.exit_code(exec_id), out or b"", err or b""

    def kill_run(self, run_id: str) -> None:
        try:
            self.short(["sh", "-c", _KILL_RUN, "sao-kill", run_id])
        except SandboxError as exc:
            log.warning("sandbox %s: could not kill run %s: %s", self.name, run_id, exc)
