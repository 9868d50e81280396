"""Errors at the boundary with agent plug-ins (the ``sao.agents`` entry-point group).

A plug-in that cannot be found or loaded is a configuration error, raised before any episode starts
(:class:`AgentPluginError`, its message lists the known names). What an agent does wrong while it runs
(it raises, hangs, never calls the model) is not an exception here: it is a recorded failed episode
(:mod:`.runner`)."""

from __future__ import annotations

from sao.agents.errors import AgentError


class AgentPluginError(AgentError):
    """An agent name that no plug-in has, one that clashes with a built-in agent, or a broken entry point."""
