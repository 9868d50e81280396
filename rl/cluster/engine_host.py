"""What runs inside one engine replica's Ray actor, on its node: :class:`EngineHost`.

The driver (:mod:`sao.rl.cluster.replicas`) creates the actor with ``ray.remote(EngineHost)`` in the
replica's placement-group bundle and calls :meth:`EngineHost.start`: the starting model is written
into the replica's node-local folder (unless it lies on a shared filesystem), the managed vLLM
(:class:`~sao.agents.engine.server.VLLMServer`, through :class:`VLLMLaunch`) starts there bound to the
node's IP, and the actor answers with a :class:`HostAddress` (URL, node id and IP, pid, log).
:meth:`~EngineHost.receive` writes a shipped weight version next to it and returns its local path.

The server's process tree is tied to the actor: ``stop()`` ends it, and if the actor's process dies
(its node is stopped, ``ray.kill``) the server gets SIGTERM from the kernel (``VLLMServer``'s
PR_SET_PDEATHSIG) and shuts its engine core down. The actor is threaded (``max_concurrency`` > 1), so
``ping`` answers while ``start`` is still waiting for the server.

:class:`FakeLaunch` serves :class:`~sao.agents.testing.fake_server.FakeServer` instead of vLLM: the tests'
engine, living in the package so that Ray workers can import it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from sao.agents.engine import VLLMServer, VLLMServerConfig
from sao.rl.weights import FolderFiles, prune, write_folder
from sao.sandboxes.tagged import kill_tagged

log = logging.getLogger(__name__)

# The environment variable that marks an engine server's processes with its replica folder, so that
# what an earlier actor left running on the node can be found (remove_earlier_incarnations).
FOLDER_TAG = "SAO_ENGINE_FOLDER"


class HostedServer(Protocol):
    """A started engine server (``VLLMServer`` is one)."""

    @property
    def root_url(self) -> str: ...

    @property
    def running(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...

    def stop(self) -> None: ...


class Launch(Protocol):
    """Start a server from ``model_dir`` bound to ``host``, its log at ``log_path``; block until it serves."""

    def __call__(self, model_dir: str, host: str, log_path: Path) -> HostedServer: ...


@dataclass(frozen=True)
class VLLMLaunch:
    """The managed vLLM of ``config``, from the replica's model folder, bound to the node's IP."""

    config: VLLMServerConfig

    def __call__(self, model_dir: str, host: str, log_path: Path) -> VLLMServer:
        env = {**self.config.env, FOLDER_TAG: str(log_path.parent)}  # every process of the server carries it
        return VLLMServer(replace(self.config, model=model_dir, host=host, port=0, log_path=log_path, env=env)).start()


@dataclass(frozen=True)
class HostAddress:
    """Where a replica serves: its root URL, and the node, process and log behind it."""

    url: str
    node_id: str
    node_ip: str
    pid: int | None
    log: str
    actor_pid: int


class EngineHost:
    """One engine replica's actor (module doc). ``node_dir``: the folder for replicas on this node
    (None: ``$TMPDIR/sao-ray``); this actor works in ``node_dir/<run_id>/replica-<i>-<random>``."""

    def __init__(self, replica: int, run_id: str, node_dir: str | None = None):
        base = Path(node_dir) if node_dir else Path(tempfile.gettempdir()) / "sao-ray"
        self.replica = replica
        self.folder = base / run_id / f"replica-{replica}-{uuid.uuid4().hex[:8]}"
        self.server: HostedServer | None = None

    def start(self, launch: Launch, model: FolderFiles | str) -> HostAddress:
        """Start the server from ``model`` (shipped files, or a path this node reads) and say where it is."""
        import ray

        self.folder.mkdir(parents=True, exist_ok=True)
        remove_earlier_incarnations(self.folder)
        model_dir = model if isinstance(model, str) else str(write_folder(model, self.folder))
        ip = ray.util.get_node_ip_address()
        log_path = self.folder / "vllm.log"
        self.server = launch(model_dir, ip, log_path)
        return HostAddress(url=self.server.root_url, node_id=ray.get_runtime_context().get_node_id(), node_ip=ip,
                           pid=self.server.pid, log=str(log_path), actor_pid=os.getpid())

    def ping(self) -> bool:
        """Whether the server runs (False before it started and after it exited)."""
        return self.server is not None and self.server.running

    def receive(self, staged: FolderFiles, keep: int = 2) -> str:
        """Write a shipped weight version into this replica's ``weights/`` and return its path; only
        the newest ``keep`` versions stay."""
        root = self.folder / "weights"
        path = write_folder(staged, root)
        prune(root, keep)
        return str(path)

    def stop(self) -> None:
        """Stop the server and its process tree, and delete the replica's folder."""
        try:
            if self.server is not None:
                self.server.stop()
        finally:
            self.server = None
            shutil.rmtree(self.folder, ignore_errors=True)


def remove_earlier_incarnations(folder: Path) -> list[Path]:
    """Stop what earlier actors of the same replica left on this node and delete their folders
    (``replica-<i>-*`` beside ``folder``, which is kept); return the folders.

    A replica restarted on the node it ran on (a failed weight load, an engine death, Ray's memory
    monitor) leaves its model copy and weights behind, about 0.6 GB each for SmolLM2 in fp32. When its
    actor was killed (``ray.kill`` is a SIGKILL), the server got SIGTERM but vLLM's engine core and
    workers could outlive it: three such engines (about 3 GB each) were still running 15 minutes later
    (2026-12-04), and the next run on the machine was killed for memory. Their processes carry the
    folder in :data:`FOLDER_TAG`. The driver ends the old actor before it starts a new one, so nothing
    live works in those folders."""
    index = folder.name.rsplit("-", 1)[0]  # "replica-<i>"
    removed = [p for p in folder.parent.glob(f"{index}-*") if p.is_dir() and p != folder]
    killed = kill_tagged(FOLDER_TAG, [str(p) for p in removed]) if removed else 0
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed %s, left by an earlier actor of this replica", path)
    if killed:
        log.info("killed %d engine processes that earlier actors of this replica left running", killed)
    return removed


class FakeHostedServer:
    """A :class:`~sao.agents.testing.fake_server.FakeServer` as a hosted engine (tests)."""

    def __init__(self, responder: Callable[[dict[str, Any], str], Any] | None = None) -> None:
        from sao.agents.testing.fake_server import FakeServer

        self.fake = FakeServer(responder=responder).__enter__()

    @property
    def root_url(self) -> str:
        return self.fake.base_url.removesuffix("/v1")

    @property
    def running(self) -> bool:
        return not self.fake.dead

    @property
    def pid(self) -> int | None:
        return os.getpid()

    def stop(self) -> None:
        self.fake.__exit__(None, None, None)


@dataclass(frozen=True)
class FakeLaunch:
    """Serves a :class:`FakeHostedServer` (on 127.0.0.1) answering with ``responder`` (the
    FakeServer's), and records the model folder it was given in ``log_path`` (tests read it)."""

    responder: Callable[[dict[str, Any], str], Any] | None = None

    def __call__(self, model_dir: str, host: str, log_path: Path) -> Any:
        log_path.write_text(f"model {model_dir}\n")
        return FakeHostedServer(self.responder)
