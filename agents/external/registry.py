"""The agent plug-ins: the entry points of the ``sao.agents`` group, by name.

A distribution registers an agent as ``[project.entry-points."sao.agents"] my-agent = "pkg.mod:run"``.
:func:`plugins` lists them, as :class:`AgentPlugin` records; :func:`find` gives one by name and
:func:`load` imports its callable. Refused, with a message that says why: a name the built-in players
take (``llm``, ``gold``, ``empty``: :data:`~.task.BUILTIN_AGENTS`), a name two distributions register,
an unknown name (the known ones listed, the closest suggested), and an entry point that does not
import or names something that is not callable. Nothing is cached: the entry points are read per
call (a few per run), so that nothing needs resetting when a distribution is installed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from sao.hints import did_you_mean

from .errors import AgentPluginError
from .task import BUILTIN_AGENTS, ENTRY_POINT_GROUP


@dataclass(frozen=True)
class AgentPlugin:
    """One registered agent: its ``name``, its entry point's ``target`` (``module:callable``) and the
    distribution that registers it (None when unknown)."""

    name: str
    target: str
    distribution: str | None = None


def _registered() -> dict[str, list[AgentPlugin]]:
    found: dict[str, list[AgentPlugin]] = defaultdict(list)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name].append(AgentPlugin(ep.name, ep.value, _distribution(ep)))
    return found


def _distribution(ep: EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return None if dist is None else dist.metadata["Name"]


def _refusal(name: str, registered: list[AgentPlugin]) -> str | None:
    if name in BUILTIN_AGENTS:
        by = ", ".join(f"{p.target} ({p.distribution or 'unknown distribution'})" for p in registered)
        return (f"agent plug-in {name!r} ({by}) is refused: {', '.join(BUILTIN_AGENTS)} are the built-in "
                f"players; register it under another name")
    if len({p.target for p in registered}) > 1:
        by = "; ".join(f"{p.target} ({p.distribution or 'unknown distribution'})" for p in registered)
        return f"agent plug-in {name!r} is registered more than once ({by}); uninstall one"
    return None


def plugins() -> dict[str, AgentPlugin]:
    """The usable plug-ins by name (the refused ones left out: :func:`refused`)."""
    return {name: found[0] for name, found in sorted(_registered().items()) if _refusal(name, found) is None}


def refused() -> dict[str, str]:
    """The registered names that are refused, with why."""
    return {name: why for name, found in sorted(_registered().items()) if (why := _refusal(name, found)) is not None}


def find(name: str) -> AgentPlugin:
    """The plug-in ``name``; :class:`AgentPluginError` for a refused or unknown one."""
    registered = _registered()
    if name in registered:
        if (why := _refusal(name, registered[name])) is not None:
            raise AgentPluginError(why)
        return registered[name][0]
    known = plugins()
    listed = ", ".join(known) or "none is installed"
    raise AgentPluginError(f"no agent plug-in {name!r}{did_you_mean(name, known, clause=True)}. Built-in agents: "
                           f"{', '.join(BUILTIN_AGENTS)}; plug-ins (entry-point group {ENTRY_POINT_GROUP!r}): {listed}")


def load(name: str) -> Callable[..., Any]:
    """The callable of the plug-in ``name``, imported; :class:`AgentPluginError` when it cannot be (the
    import's error named) or is not callable."""
    plugin = find(name)
    try:
        obj = EntryPoint(name=plugin.name, value=plugin.target, group=ENTRY_POINT_GROUP).load()
    except Exception as exc:  # noqa: BLE001 - a broken plug-in: any import error, said as it is
        raise AgentPluginError(f"agent plug-in {name!r} ({plugin.target}) failed to load: "
                               f"{type(exc).__name__}: {exc}") from exc
    if not callable(obj):
        raise AgentPluginError(f"agent plug-in {name!r} ({plugin.target}) is a {type(obj).__name__}, not a "
                               "callable (task, endpoint) -> AgentResult")
    return obj
