"""Request routing across engine replicas (WAR, METHOD.md 3): which replica serves a trajectory's next turn.

Clock-agnostic and pure like the schedulers: a driver (the simulator, a real driver over vLLM
replicas, ``sao-eval`` with several replicas) builds a :class:`RouteRequest` for each request and a
:class:`ReplicaView` per replica (read from its engine: running and queued requests and KV usage
from vLLM's metrics endpoint; which trajectories' prefixes it holds from the driver's own record of
where each trajectory ran last) and asks a :class:`Router` for a replica.

Constraints come first, then preference. A replica is *eligible* for a request when it is
``accepting`` (alive, not loading weights) and its version satisfies the request:

* ``version``: C1 (one version per trajectory, every mode but ``async``): exactly this version.
  A new trajectory of ``multi_version`` carries the version its scheduler admitted it on.
* ``min_version``: no older replica than this (``async``: the version of the trajectory's last
  turn, so routing never makes a trajectory staler; a new trajectory: the scheduler's admission
  floor, the newest version unless ``admit_lag > 0``).

Routers (:data:`ROUTERS`):

* :class:`Pinned`: every turn on the replica the trajectory was admitted on (``home``); what the
  driver did before routing existed.
* :class:`RoundRobin`: the next eligible replica in turn; ignores caches (the baseline).
* :class:`CacheAware`: a later turn goes to an eligible replica holding its prefix unless that
  replica's pressure exceeds the least-loaded eligible replica's by more than ``margin`` (plus
  ``margin_per_ktoken`` per thousand prefix tokens: the longer the prefix, the more a move costs
  in recomputed prefill); otherwise, and for new trajectories, the least-loaded eligible replica.
  Pressure = max((running + queued) / capacity, KV usage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sao.hints import did_you_mean

from ..errors import AgentError


class RouterConfigError(AgentError, ValueError):
    """A router that cannot be made (an unknown name, a negative margin); the message says what to change."""


@dataclass(frozen=True)
class ReplicaView:
    """One replica as a router sees it. ``holds``: ids of the trajectories whose prefix its prefix
    cache holds. ``capacity``: requests it runs at once (vLLM ``max_num_seqs``), to compare loads."""

    rid: int
    version: int
    running: int = 0
    queued: int = 0
    kv_usage: float = 0.0
    capacity: int = 1
    holds: frozenset[int] = frozenset()
    accepting: bool = True

    @property
    def pressure(self) -> float:
        return max((self.running + self.queued) / max(self.capacity, 1), self.kv_usage)


@dataclass(frozen=True)
class RouteRequest:
    """One request: turn ``turn`` (0 = a new trajectory) of trajectory ``traj_id``, whose context
    before this turn's new input is ``prefix_tokens`` long. ``version`` / ``min_version``: the
    constraints of the module docstring (None: none). ``home``: the replica it was admitted on."""

    traj_id: int
    turn: int = 0
    prefix_tokens: int = 0
    version: int | None = None
    min_version: int | None = None
    home: int | None = None


def eligible(request: RouteRequest, replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """The replicas that may serve ``request`` (module docstring), in the given order."""
    return [r for r in replicas if r.accepting
            and (request.version is None or r.version == request.version)
            and (request.min_version is None or r.version >= request.min_version)]


def least_loaded(replicas: Sequence[ReplicaView]) -> ReplicaView:
    """Lowest pressure, then fewest requests, then lowest id."""
    return min(replicas, key=lambda r: (r.pressure, r.running + r.queued, r.rid))


class Router(Protocol):
    """Chooses a replica for a request; None when no replica is eligible (the driver waits)."""

    name: str

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int | None: ...


class Pinned:
    """Every turn on the trajectory's ``home`` replica while it is eligible, else the least loaded."""

    name = "pinned"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int | None:
        ok = eligible(request, replicas)
        if not ok:
            return None
        home = [r for r in ok if r.rid == request.home]
        return home[0].rid if home else least_loaded(ok).rid


class RoundRobin:
    """The eligible replica after the one chosen last (by id, wrapping around); caches ignored."""

    name = "round_robin"

    def __init__(self) -> None:
        self._last = -1

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int | None:
        ok = sorted(eligible(request, replicas), key=lambda r: r.rid)
        if not ok:
            return None
        after = [r for r in ok if r.rid > self._last]
        self._last = (after[0] if after else ok[0]).rid
        return self._last


class CacheAware:
    """Prefix-cache locality unless the holder is overloaded; least-loaded otherwise (module doc)."""

    name = "cache_aware"

    def __init__(self, margin: float = 0.25, margin_per_ktoken: float = 0.05) -> None:
        if margin < 0 or margin_per_ktoken < 0:
            raise RouterConfigError(f"routing margins must be >= 0, got {margin}, {margin_per_ktoken}")
        self.margin, self.margin_per_ktoken = margin, margin_per_ktoken

    def allowed_gap(self, request: RouteRequest) -> float:
        """How much more pressure than the least-loaded replica a prefix holder may have."""
        return self.margin + self.margin_per_ktoken * request.prefix_tokens / 1000.0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int | None:
        ok = eligible(request, replicas)
        if not ok:
            return None
        best = least_loaded(ok)
        holders = [r for r in ok if request.traj_id in r.holds]
        if request.turn > 0 and holders:
            holder = least_loaded(holders)
            if holder.pressure - best.pressure <= self.allowed_gap(request):
                return holder.rid
        return best.rid


ROUTERS = ("pinned", "round_robin", "cache_aware")


def make_router(name: str, margin: float = 0.25, margin_per_ktoken: float = 0.05) -> Router:
    """The router called ``name`` (unknown names suggest the closest); margins for ``cache_aware``."""
    if name == "pinned":
        return Pinned()
    if name == "round_robin":
        return RoundRobin()
    if name == "cache_aware":
        return CacheAware(margin, margin_per_ktoken)
    hint = did_you_mean(name, ROUTERS, clause=True)
    raise RouterConfigError(f"unknown router {name!r}{hint} (known: {', '.join(ROUTERS)})")
