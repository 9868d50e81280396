"""agents/external/registry.py: the plug-ins of the ``sao.agents`` entry-point group, found through the real
``importlib.metadata`` lookup of a test distribution (tests/agent_plugins.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.agents.external import registry
from sao.agents.external.errors import AgentPluginError
from sao.agents.testing import fake_agents
from tests.agent_plugins import FAKE, install_agents


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_agents(tmp_path / "a", monkeypatch, {
        "fake-gold": f"{FAKE}:gold", "llm": f"{FAKE}:gold", "broken": "no_such_module_for_sao_tests:run",
        "not-callable": f"{FAKE}:_PROBLEM", "twice": f"{FAKE}:gold"})
    install_agents(tmp_path / "b", monkeypatch, {"twice": f"{FAKE}:wrong"}, distribution="other-agents")


def test_plugins_are_listed_with_their_distribution_and_the_refused_ones_apart(installed: None):
    found = registry.plugins()
    assert found["fake-gold"] == registry.AgentPlugin("fake-gold", f"{FAKE}:gold", "fake-agents")
    assert "llm" not in found and "twice" not in found
    refused = registry.refused()
    assert "built-in players" in refused["llm"] and "register it under another name" in refused["llm"]
    assert "more than once" in refused["twice"] and "other-agents" in refused["twice"]


def test_a_name_clashing_with_a_builtin_agent_is_refused(installed: None):
    with pytest.raises(AgentPluginError, match="'llm' .* is refused: llm, gold, empty are the built-in players"):
        registry.find("llm")


def test_an_unknown_name_lists_the_known_ones_and_suggests_the_closest(installed: None):
    with pytest.raises(AgentPluginError) as caught:
        registry.find("fake-golt")
    message = str(caught.value)
    assert "no agent plug-in 'fake-golt'; did you mean 'fake-gold'?" in message
    assert "Built-in agents: llm, gold, empty" in message and "fake-gold" in message


def test_load_imports_the_callable_and_a_broken_entry_point_says_why(installed: None):
    assert registry.load("fake-gold") is fake_agents.gold
    with pytest.raises(AgentPluginError, match="'broken' .* failed to load: ModuleNotFoundError"):
        registry.load("broken")
    with pytest.raises(AgentPluginError, match="is a Pattern, not a callable"):
        registry.load("not-callable")


def test_without_plugins_the_message_says_none_is_installed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    assert registry.plugins() == {}
    with pytest.raises(AgentPluginError, match="plug-ins .*: none is installed"):
        registry.find("anything")
