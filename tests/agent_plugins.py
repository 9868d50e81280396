"""Agent plug-ins installed for a test: a distribution's metadata (``NAME-0.1.dist-info`` with an
``entry_points.txt`` of the ``sao.agents`` group) in a folder put on ``sys.path``, so that the real
``importlib.metadata`` lookup finds them, as it finds an installed package's."""

from __future__ import annotations

from pathlib import Path

import pytest

FAKE = "sao.agents.testing.fake_agents"


def install_agents(folder: Path, monkeypatch: pytest.MonkeyPatch, agents: dict[str, str],
                   distribution: str = "fake-agents") -> None:
    """Register ``agents`` (name -> ``module:callable``) as the distribution ``distribution``."""
    info = folder / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in agents.items())
    (info / "entry_points.txt").write_text(f"[sao.agents]\n{lines}")
    monkeypatch.syspath_prepend(str(folder))
