"""DockerSandbox's parts on a scripted Docker client: the container it asks for (limits, no network, labels),
how an exec's output, exit code and timeout come back, file errors, and the removal of a container the
daemon lost track of. The real daemon runs the same calls in tests/test_sandboxes_docker.py."""

from __future__ import annotations

import io
import os
import tarfile
from typing import Any

import docker.errors
import pytest

from sao.sandboxes import LABEL_KEY, DockerSandbox, SandboxClosedError, SandboxError, SandboxLimits
from sao.sandboxes.docker_cleanup import OWNER_LABEL_KEY, registry
from sao.sandboxes.docker_exec import raise_if_gone


class Container:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.id, self.files, self.started, self.removed = "c0ffee", files, False, 0

    def start(self) -> None:
        self.started = True

    def remove(self, force: bool, v: bool) -> None:
        assert force and v
        self.removed += 1

    def get_archive(self, path: str) -> tuple[list[bytes], dict[str, Any]]:
        if path not in self.files:
            raise docker.errors.NotFound(f"Could not find the file {path} in container c0ffee")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
            info.size = len(self.files[path])
            tar.addfile(info, io.BytesIO(self.files[path]))
        return [buf.getvalue()], {"mode": 0o644}

    def put_archive(self, parent: str, archive: bytes) -> None:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar:
                extracted = tar.extractfile(member)
                assert extracted is not None
                self.files[f"{parent.rstrip('/')}/{member.name}"] = extracted.read()


class Client:
    """The few calls DockerSandbox makes; each exec answers ``(output, exit code)`` from ``replies``
    (``RUN_ID`` in an output stands for the run id the wrapper was given)."""

    def __init__(self, replies: list[tuple[bytes, int]] | None = None, files: dict[str, bytes] | None = None):
        self.container = Container(files or {})
        self.created: dict[str, Any] = {}
        self.execs: list[list[str]] = []
        self.replies = list(replies or [])
        self.codes: dict[str, int] = {}
        self.removed: list[str] = []

    @property
    def containers(self) -> Client:
        return self

    @property
    def api(self) -> Client:
        return self

    def list(self, **kw: Any) -> list[Any]:  # the orphan sweep
        return []

    def create(self, image: str, **kw: Any) -> Container:
        self.created = {"image": image, **kw}
        return self.container

    def exec_create(self, container_id: str, argv: list[str], **kw: Any) -> dict[str, str]:
        assert container_id == "c0ffee" and not kw["tty"] and not kw["stdin"]
        self.execs.append(argv)
        return {"Id": f"exec{len(self.execs)}"}

    def exec_start(self, exec_id: str, stream: bool, demux: bool) -> Any:
        out, code = self.replies.pop(0)
        argv = self.execs[int(exec_id.removeprefix("exec")) - 1]
        out = out.replace(b"RUN_ID", argv[4].encode()) if argv[3] == "sao-run" else out
        self.codes[exec_id] = code
        return iter([out]) if stream else (out, b"")

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        return {"Running": False, "ExitCode": self.codes[exec_id]}

    def remove_container(self, container_id: str, force: bool, v: bool) -> None:
        self.removed.append(container_id)


def test_the_container_asked_for_has_the_limits_no_network_and_the_clean_up_labels():
    client = Client()
    limits = SandboxLimits(cpus=1.5, memory_mb=512, pids=64)
    with DockerSandbox("img:1", limits=limits, label="run-7", client=client, workdir="/w") as sb:
        assert client.container.started and sb.id == "c0ffee" and sb.name.startswith("sao-")
        made = client.created
        assert made["labels"][LABEL_KEY] == "run-7" and made["labels"][OWNER_LABEL_KEY].endswith(f":{os.getpid()}")
        assert made["network_mode"] == "none"  # network off unless asked
        assert (made["nano_cpus"], made["mem_limit"], made["memswap_limit"], made["pids_limit"]) == \
            (1_500_000_000, "512m", "512m", 64)
        assert made["cap_drop"] == ["ALL"] and made["cap_add"] is None
        assert made["security_opt"] == ["no-new-privileges"] and made["init"] and made["working_dir"] == "/w"
        assert made["command"] == ["sleep", "infinity"] and made["volumes"] is None
    assert sb.closed and client.container.removed == 1
    sb.close()  # idempotent
    assert client.container.removed == 1
    with DockerSandbox("img:1", limits=SandboxLimits(network=True), client=Client()) as sb:
        assert sb._client.created["network_mode"] is None


def test_a_command_runs_in_the_wrapper_with_its_exit_code_and_a_timeout_is_a_result():
    client = Client(replies=[(b"hello\n", 3)])
    with DockerSandbox("img:1", client=client, workdir="/w") as sb:
        result = sb.run("echo hello; exit 3", timeout_s=7, workdir="sub")
        argv = client.execs[0]
        assert argv[:2] == ["sh", "-c"] and argv[3] == "sao-run" and argv[5:] == ["7.000", "/w/sub", "echo hello; exit 3"]
        assert (result.exit_code, result.output, result.timed_out) == (3, "hello\n", False)
        client.replies.append((b"partial__SAO_TIMEOUT_RUN_ID__", 124))
        timed = sb.run("sleep 100", timeout_s=1)
        assert (timed.exit_code, timed.timed_out) == (124, True)
        assert timed.output == "partial\n[... command timed out after 1 s and was killed ...]\n"
        client.replies.append((b"__SAO_TIMEOUT_another__", 0))
        other = sb.run("true")
        assert not other.timed_out and other.output == "__SAO_TIMEOUT_another__"  # not this run's sentinel
        with pytest.raises(ValueError, match="NUL"):
            sb.run("a\0b")
    with pytest.raises(SandboxClosedError):
        sb.run("true")


def test_files_read_write_and_list_errors():
    client = Client(replies=[(b"", 3), (b"a\0.b\0", 0)], files={"/w/x.txt": b"data"})
    with DockerSandbox("img:1", client=client, workdir="/w") as sb:
        assert sb.read_file("x.txt") == b"data"
        with pytest.raises(FileNotFoundError, match="missing"):
            sb.read_file("missing")
        sb.write_file("y.txt", "text")
        assert client.container.files["/w/y.txt"] == b"text"
        with pytest.raises(FileNotFoundError, match="no such directory"):
            sb.list_dir("nowhere")
        assert sb.list_dir(".") == [".b", "a"]
        assert client.execs[-1][3:] == ["sao-ls", "/w"]
    with pytest.raises(SandboxClosedError):
        sb.write_file("z", b"")


def test_a_container_that_is_gone_closes_the_sandbox_and_other_errors_stay_sandbox_errors():
    with pytest.raises(SandboxClosedError, match="gone or stopped"):
        raise_if_gone(docker.errors.NotFound("No such container: c0ffee"), "sb")
    with pytest.raises(SandboxClosedError):
        raise_if_gone(docker.errors.APIError("container c0ffee is not running"), "sb")
    raise_if_gone(docker.errors.NotFound("Could not find the file /x"), "sb")  # a missing file: the caller's error
    assert issubclass(SandboxClosedError, SandboxError)


def test_a_removal_that_failed_while_the_daemon_was_away_is_done_when_it_answers():
    client = Client()
    sb = DockerSandbox("img:1", client=client)

    def away(force: bool, v: bool) -> None:
        raise docker.errors.APIError("connection refused")

    client.container.remove = away  # type: ignore[method-assign]
    sb.close()
    assert sb.closed and client.removed == []
    nxt = DockerSandbox("img:1", client=client)  # the next sandbox finds the daemon answering
    assert client.removed == ["c0ffee"]
    del client.container.remove  # the daemon is back
    nxt.close()
    registry.remove_unremoved(client)
    assert client.removed == ["c0ffee"]  # done once
