"""A stand-in for the ``docker`` command line, for tests of agents that start their own containers with it
(mini-swe-agent's ``DockerEnvironment``) where no Docker daemon runs.

Run as ``python -m sao.agents.testing.fake_docker ARGS...`` (:func:`install` writes an executable that does),
with ``SAO_FAKE_DOCKER_DIR`` naming a directory that holds:

- ``calls.jsonl``: every invocation's arguments, one JSON list a line, appended;
- ``root/``: the "container's" file system: ``exec -w /testbed`` runs in ``root/testbed``.

``run -d --name NAME ...`` prints the container id ``NAME``; ``exec [-w DIR] [-e K=V]... ID CMD...`` runs
``CMD`` on this machine in ``root/DIR`` (the ``-e`` variables are recorded, not applied) and exits with its
status; every other command (``rm``, ``stop``) is recorded and succeeds. The commands a test scripts run
on the host, in that directory: this is a fake of the CLI, not a sandbox.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

DIR_VARIABLE = "SAO_FAKE_DOCKER_DIR"


def install(directory: Path) -> Path:
    """Write an executable ``docker`` into ``directory`` that runs this module with this interpreter and
    records under ``directory``; return its path (``root/`` is created)."""
    (directory / "root").mkdir(parents=True, exist_ok=True)
    path = directory / "docker"
    path.write_text(f'#!/bin/sh\n{DIR_VARIABLE}="{directory}" exec "{sys.executable}" -m {__name__} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def calls(directory: Path) -> list[list[str]]:
    """The recorded invocations, in order."""
    log = directory / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _exec(args: list[str], root: Path) -> int:
    workdir, i = "/", 0
    while args[i].startswith("-"):
        if args[i] in ("-w", "--workdir"):
            workdir = args[i + 1]
        i += 2 if args[i] in ("-w", "--workdir", "-e", "--env") else 1
    command = args[i + 1:]
    done = subprocess.run(command, cwd=root / workdir.lstrip("/"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sys.stdout.buffer.write(done.stdout)
    return done.returncode


def main(argv: list[str]) -> int:
    directory = Path(os.environ[DIR_VARIABLE])
    with open(directory / "calls.jsonl", "a") as log:
        log.write(json.dumps(argv) + "\n")
    if argv[:1] == ["run"]:
        print(argv[argv.index("--name") + 1] if "--name" in argv else "fake-container")
        return 0
    if argv[:1] == ["exec"]:
        return _exec(argv[1:], directory / "root")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
