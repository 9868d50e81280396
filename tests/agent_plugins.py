"""Agent plug-ins installed for a test: a distribution's metadata (``NAME-0.1.dist-info`` with an
``entry_points.txt`` of the ``sao.agents`` group) in a folder put on ``sys.path`` (:func:`install_agents`,
this process) or on ``PYTHONPATH`` (:func:`with_path`, a child process's environment), so that the real
``importlib.metadata`` lookup finds them, as it finds an installed package's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FAKE = "sao.agents.testing.fake_agents"


def write_dist_info(folder: Path, agents: dict[str, str], distribution: str = "fake-agents") -> Path:
    """Write the metadata registering ``agents`` (name -> ``module:callable``) as ``distribution``; ``folder``."""
    info = folder / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in agents.items())
    (info / "entry_points.txt").write_text(f"[sao.agents]\n{lines}")
    return folder


def install_agents(folder: Path, monkeypatch: pytest.MonkeyPatch, agents: dict[str, str],
                   distribution: str = "fake-agents") -> None:
    """Register ``agents`` (name -> ``module:callable``) as the distribution ``distribution``, in this process."""
    monkeypatch.syspath_prepend(str(write_dist_info(folder, agents, distribution)))


def with_path(folder: Path) -> dict[str, str]:
    """This process's environment with ``folder`` first on ``PYTHONPATH``: a child process finds what it holds."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
