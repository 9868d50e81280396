"""A folder of wheels for an offline image build, downloaded once from the package registry.

:func:`fetch_wheels` runs ``pip download --only-binary=:all: --no-deps`` for the *target*
interpreter and platform (``--python-version X.Y --platform manylinux2014_x86_64``), not the
host's, so the host may run any Python. ``--no-deps`` makes the list the whole truth: every
distribution the environment needs must be named, pinned (``name==version``), as ``pip freeze``
prints them. A missing one surfaces inside the image as pip's "No matching distribution", never
as a silent download. The folder is cached by a hash of the sorted requirement lines and the
target; a second call with the same list costs nothing and needs no network.

Cache: ``$SAO_SWE_WHEELS_DIR``, else ``$XDG_CACHE_HOME/sao/swe-wheels`` (``~/.cache/...``). A
folder is complete when its ``.complete`` marker exists; an interrupted download leaves only a
``*.partial-*`` folder behind, which the next call ignores.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import SandboxStartError

WHEELS_DIR_ENV = "SAO_SWE_WHEELS_DIR"
DEFAULT_PLATFORM = "manylinux2014_x86_64"
COMPLETE = ".complete"


@dataclass(frozen=True)
class Wheelhouse:
    """A folder of wheel files and the requirement lines it was made from (empty for a given folder)."""

    path: Path
    requirements: tuple[str, ...] = ()

    def files(self) -> list[Path]:
        return sorted(self.path.glob("*.whl"))


def wheels_cache_dir() -> Path:
    if os.environ.get(WHEELS_DIR_ENV):
        return Path(os.environ[WHEELS_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "sao" / "swe-wheels"


def requirement_lines(lines: Iterable[str]) -> tuple[str, ...]:
    """Requirement lines without comments and blanks, in order, each once; options (``-r``, ``-e``,
    ``--index-url`` ...) are refused: the list must name pinned distributions only."""
    out: list[str] = []
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise SandboxStartError(f"requirement line {raw.strip()!r}: options are not supported here; list "
                                    "pinned distributions only (name==version), one a line")
        if "==" not in line and " @ " not in line:
            raise SandboxStartError(f"requirement {line!r} is not pinned; write name==version (the download uses "
                                    "--no-deps, so the list must be complete and exact, as `pip freeze` prints it)")
        if line not in out:
            out.append(line)
    return tuple(out)


def read_requirements(path: str | os.PathLike) -> tuple[str, ...]:
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise SandboxStartError(f"cannot read the requirements file {path}: {exc}") from exc
    return requirement_lines(text.splitlines())


def wheels_key(requirements: Sequence[str], *, python: str, platform: str = DEFAULT_PLATFORM) -> str:
    blob = json.dumps({"requirements": sorted(requirements), "python": python, "platform": platform}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def fetch_wheels(requirements: Sequence[str], *, python: str, platform: str = DEFAULT_PLATFORM,
                 cache_dir: Path | None = None, timeout_s: float = 1800) -> Wheelhouse:
    """The cached folder of wheels for ``requirements`` (pinned lines), downloading them on first use.

    Raises :class:`SandboxStartError` with pip's output tail when a wheel cannot be had (no binary
    for that Python or platform, no network to the registry).
    """
    reqs = requirement_lines(requirements)
    root = cache_dir or wheels_cache_dir()
    folder = root / f"py{python}-{wheels_key(reqs, python=python, platform=platform)[:20]}"
    if (folder / COMPLETE).exists():
        return Wheelhouse(folder, reqs)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f"{folder.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    (partial / "requirements.txt").write_text("".join(f"{r}\n" for r in reqs), encoding="utf-8")
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--progress-bar",
           "off", "--only-binary=:all:", "--no-deps", "--python-version", python, "--platform", platform,
           "--dest", str(partial), "-r", str(partial / "requirements.txt")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise SandboxStartError(f"pip download took longer than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SandboxStartError(f"pip download of {len(reqs)} wheels for Python {python} ({platform}) failed "
                                f"(exit {proc.returncode}):\n{tail}")
    (partial / COMPLETE).write_text("".join(f"{p.name}\n" for p in sorted(partial.glob("*.whl"))), encoding="utf-8")
    try:
        partial.rename(folder)
    except OSError:  # another process finished the same folder first
        shutil.rmtree(partial, ignore_errors=True)
    return Wheelhouse(folder, reqs)


def wheel_manifest(folder: Path) -> list[tuple[str, str]]:
    """``(file name, sha256)`` of every wheel in a user-given folder, for cache keys."""
    out = []
    for path in sorted(folder.glob("*.whl")):
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        out.append((path.name, digest.hexdigest()))
    return out
