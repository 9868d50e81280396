"""Files in and out of a sandbox's container: the archive API (``get_archive``/``put_archive``: a tar in
memory), which needs no network inside the container; listing a directory and creating missing parent
directories use a short exec."""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from typing import Any

from .docker_exec import ContainerExec, raise_if_gone
from .errors import SandboxError

# argv: $1 directory. Exit 3: missing, 4: not a directory, 5: cannot enter. NUL-separated names.
_LIST_DIR = r"""
[ -e "$1" ] || [ -L "$1" ] || exit 3
[ -d "$1" ] || exit 4
cd -- "$1" || exit 5
for f in .* *; do
    case $f in .|..) continue ;; esac
    [ -e "$f" ] || [ -L "$f" ] || continue
    printf '%s\0' "$f"
done
"""

_GO_MODE_DIR = 1 << 31  # Go's os.ModeDir in the archive stat header
_GO_MODE_SYMLINK = 1 << 27


class ContainerFiles:
    """File operations on one sandbox's container. ``target`` is an absolute path in the container;
    ``path`` is the caller's spelling of it, for messages."""

    def __init__(self, container: Any, execs: ContainerExec):
        self._container = container
        self._exec = execs
        self.name = execs.name

    def read(self, target: str, path: str) -> bytes:
        import docker.errors

        for _ in range(8):  # follow symlinks
            try:
                stream, stat = self._container.get_archive(target)
                data = b"".join(stream)
            except docker.errors.NotFound as exc:
                raise_if_gone(exc, self.name)
                raise FileNotFoundError(f"{path}: no such file in sandbox {self.name}") from exc
            except docker.errors.DockerException as exc:
                raise_if_gone(exc, self.name)
                raise SandboxError(f"sandbox {self.name}: cannot read {path}: {exc}") from exc
            mode = int(stat.get("mode", 0))
            if mode & _GO_MODE_DIR:
                raise IsADirectoryError(f"{path}: is a directory in sandbox {self.name}")
            if mode & _GO_MODE_SYMLINK and stat.get("linkTarget"):
                target = posixpath.join(posixpath.dirname(target), stat["linkTarget"])
                continue
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member in tar:
                    if member.isfile():
                        extracted = tar.extractfile(member)
                        assert extracted is not None
                        return extracted.read()
            raise SandboxError(f"sandbox {self.name}: {path} is not a regular file")
        raise SandboxError(f"sandbox {self.name}: too many levels of symbolic links at {path}")

    def write(self, target: str, path: str, payload: bytes, mode: int) -> None:
        import docker.errors

        parent, name = posixpath.split(target)
        if not name:
            raise IsADirectoryError(f"{path}: not a file path")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), mode, int(time.time())
            tar.addfile(info, io.BytesIO(payload))
        archive = buf.getvalue()
        for attempt in range(2):
            try:
                self._container.put_archive(parent, archive)
                return
            except docker.errors.NotFound as exc:
                raise_if_gone(exc, self.name)
                if attempt:
                    raise SandboxError(f"sandbox {self.name}: cannot create {parent}") from exc
                code, _, err = self._exec.short(["mkdir", "-p", "--", parent])
                if code:
                    raise SandboxError(f"sandbox {self.name}: mkdir -p {parent} failed: "
                                       f"{err.decode(errors='replace').strip()}") from exc
            except docker.errors.DockerException as exc:
                raise_if_gone(exc, self.name)
                raise SandboxError(f"sandbox {self.name}: cannot write {path}: {exc}") from exc

    def list_dir(self, target: str, path: str) -> list[str]:
        code, out, err = self._exec.short(["sh", "-c", _LIST_DIR, "sao-ls", target])
        if code == 3:
            raise FileNotFoundError(f"{path}: no such directory in sandbox {self.name}")
        if code == 4:
            raise NotADirectoryError(f"{path}: not a directory in sandbox {self.name}")
        if code:
            raise SandboxError(f"sandbox {self.name}: cannot list {path}: {err.decode(errors='replace').strip()}")
        return sorted(name.decode("utf-8", errors="surrogateescape") for name in out.split(b"\0") if name)
