"""The capture proxy as an external agent's :class:`~sao.agents.external.sessions.SessionOpener`:
``CaptureSessions(proxy, upstream, rule)(episode_id)`` opens that episode's session on a running
:class:`~.proxy.CaptureProxy`, sampling through ``upstream`` under ``rule``.

An evaluation makes one opener for the run (the agent's own settings, :class:`~.sampling.AgentSampling`);
training makes one per episode, since each episode samples through its own versioned client and the
run's settings are pinned (:class:`~.sampling.PinnedSampling`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .proxy import CaptureProxy
from .sampling import SamplingRule
from .session import ProxySession
from .upstream import Upstream


@dataclass(frozen=True)
class CaptureSessions:
    """Opens each episode's session on ``proxy`` (a context manager that closes it; module doc)."""

    proxy: CaptureProxy
    upstream: Upstream
    rule: SamplingRule

    def __call__(self, episode_id: str) -> ProxySession:
        return self.proxy.session(self.upstream, self.rule, episode_id)
