"""The seam between an external agent's episode and the capture proxy: what the runner needs of a
capture session, and a pass-through session for an endpoint without a proxy in front.

A session opener is ``open(episode_id)``, a context manager (plain or async) of a
:class:`CaptureSessionLike`: the OpenAI-compatible ``base_url`` the agent is pointed at (a session of
the capture proxy, ``/sessions/<id>/v1``), the model name and the API key; how many chat calls it
served (``n_calls``); and ``assemble()``, what it captured (:class:`AssembledLike`: the episode's tokens,
action mask, log-probs and turns, its segments and stats; no tokens for text calls). The capture proxy
(:mod:`sao.agents.capture`) provides the real one.

:class:`PassThroughSessions` hands every episode the endpoint itself: nothing is captured, ``n_calls``
is unknown (0), and an episode's record is text with no turns. It serves evaluation before the proxy
is wired in; training needs the proxy (the runner's ``require_calls``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sao.agents.records import TurnRecord

from .task import AgentEndpoint

if TYPE_CHECKING:
    from sao.agents.capture.segments import CaptureStats


class AssembledLike(Protocol):
    """What a capture session assembled from its calls (shapes as on :class:`~sao.agents.records.Trajectory`;
    all empty in text mode but ``turns``)."""

    token_ids: Sequence[int]
    action_mask: Sequence[int]
    logprobs: Sequence[float]
    turns: Sequence[TurnRecord]
    segments: Sequence[Any]
    stats: CaptureStats


class CaptureSessionLike(Protocol):
    """One episode's session: where the agent sends its calls, and what they were."""

    base_url: str
    model: str
    api_key: str

    @property
    def n_calls(self) -> int: ...

    def assemble(self) -> AssembledLike | None: ...


class SessionOpener(Protocol):
    """``open(episode_id)``: a context manager (plain or async) of that episode's session."""

    def __call__(self, episode_id: str) -> Any: ...


@dataclass(frozen=True)
class PassThroughSession:
    """The endpoint itself as a session: nothing captured (module doc)."""

    base_url: str
    model: str
    api_key: str = "EMPTY"

    @property
    def n_calls(self) -> int:
        return 0

    def assemble(self) -> None:
        return None


@dataclass(frozen=True)
class PassThroughSessions:
    """A :class:`SessionOpener` that gives every episode ``endpoint`` unchanged."""

    endpoint: AgentEndpoint

    @contextlib.contextmanager
    def __call__(self, episode_id: str) -> Iterator[PassThroughSession]:
        yield PassThroughSession(self.endpoint.base_url, self.endpoint.model, self.endpoint.api_key)
