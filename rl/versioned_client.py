"""The policy version of each turn: a completion client that stamps what its replica served.

A sync can land mid-request (``pause_mode="keep"`` lets the request continue on the new weights),
so every turn records the replica's version when its request was sent and when it came back. The
oldest of them is the trajectory's version for staleness (METHOD.md 1.10).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from sao.agents import Completion, Trajectory, VersionSpan
from sao.agents.client import SamplingParams

if TYPE_CHECKING:
    from sao.rl.replica_health import Replica


class VersionedClient:
    """Stamps each completion with the replica's version at request time and at answer time."""

    def __init__(self, replica: Replica):
        self.replica = replica

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        before = self.replica.version
        completion = await self.replica.client.complete(prompt_ids, params)
        return replace(completion, policy_versions=VersionSpan(before, self.replica.version))


def turn_versions(trajectory: Trajectory, fallback: int) -> tuple[int, ...]:
    """Every version a trajectory's turns were sampled by (one per turn, two for a turn a sync
    landed in), in turn order; ``(fallback,)`` when no turn has one."""
    out: list[int] = []
    for span in trajectory.policy_versions:
        if span is not None:
            out += [span.first] if span.first == span.last else [span.first, span.last]
    return tuple(out) or (fallback,)
