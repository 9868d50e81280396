"""A running request that moves between replicas of one version: how the real driver executes
:class:`~sao.rl.rollout.schedulers.MoveTrajectory` (DORA's rebalancing, METHOD.md 2).

The ``multi_version`` scheduler moves every trajectory of a lightly loaded draining replica (the
source) to its peers of the same version, then syncs the source (:mod:`sao.rl.rollout.schedulers.rebalance`).
The driver does it in three steps:

1. **Move** (:meth:`Moves.move`): the trajectory's :class:`Seat` points at the target; every later
   request of its episode goes there.
2. **Drain** (:meth:`Moves.drain`, before the source loads its new version): pause the source with
   ``mode="abort"``. vLLM 0.32 then finishes every request in flight with ``finish_reason == "abort"``
   and answers it like any other, with the tokens it had generated and their log-probs, on
   ``/v1/completions`` and on the token route (whose ``weight_versions`` spans cover them). The drain
   waits until every request sent to the source has come back: one that reached the engine after the
   pause waits in its queue, so the source is aborted again until none is left.
3. **Continue** (:class:`MovingClient`): a request that came back ``"abort"`` from a replica its
   trajectory has left is sent again to its seat, as the prompt plus the tokens generated so far, with
   ``max_tokens`` less those. The turn's completion is the merge: the partial tokens with their
   log-probs and versions, then the continuation's. Both replicas serve the trajectory's version (C1:
   the scheduler's move requires it, and the target cannot upgrade while the trajectory is on it);
   nothing already sampled is sampled again (C2: no bias towards short answers). The target computes
   the prefix again (its prefill).

Races. A request that finished on the source before the abort landed comes back whole: nothing
moves within the turn, the episode's next turn goes to the target. An episode between two turns
at the move sends its next request to the target. The target's death mid-continuation cancels the
episode like any other on a dead replica (the driver's ``_orphan``: the scheduler re-queues it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from sao.agents import Completion, VersionSpan
from sao.agents.clients import CompletionClient, SamplingParams
from sao.agents.records import VersionRuns
from sao.rl.rollout.schedulers import MoveTrajectory
from sao.rl.weights import WeightControl

log = logging.getLogger(__name__)

ABORT = "abort"  # vLLM's finish_reason for a request that a pause (mode "abort") or an abort ended
_SEED_STRIDE = 1_000_003  # a continuation's seed: its own random stream, a function of (seed, tokens so far)


@dataclass
class Seat:
    """Where a running trajectory's requests go: ``replica``, changed by a move."""

    replica: int


class MovingClient:
    """The :class:`~sao.agents.clients.CompletionClient` of one episode: each request goes to its
    seat's replica (``client_for(rid)``), and one that a move aborted is continued on the replica it
    moved to (module doc). ``out`` counts the requests each replica has out (the drain waits on it)."""

    def __init__(self, seat: Seat, client_for: Callable[[int], CompletionClient], out: Counter[int],
                 on_continued: Callable[[int], None] = lambda n: None):
        self.seat, self.client_for, self.out, self.on_continued = seat, client_for, out, on_continued

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        parts: list[Completion] = []
        while True:
            rid, done = self.seat.replica, [t for p in parts for t in p.token_ids]
            self.out[rid] += 1
            try:
                part = await self.client_for(rid).complete([*prompt_ids, *done], continued(params, len(done)))
            finally:
                self.out[rid] -= 1
            parts.append(part)
            if part.finish_reason != ABORT or self.seat.replica == rid:
                return merge(parts)  # whole, or an abort that was no move's (returned as vLLM said it)
            done_now = len(done) + len(part.token_ids)
            log.info("a request moved from replica %d to %d after %d tokens; continuing it there", rid,
                     self.seat.replica, done_now)
            self.on_continued(done_now)
            if params.max_tokens is not None and done_now >= params.max_tokens:
                return replace(merge(parts), finish_reason="length")  # it had generated all it could


def continued(params: SamplingParams, done: int) -> SamplingParams:
    """``params`` for the rest of a request that generated ``done`` tokens: ``max_tokens`` less those,
    and a seed of its own (a stream not correlated with the draws the first part used)."""
    if not done:
        return params
    seed = None if params.seed is None else (params.seed + _SEED_STRIDE * done) % (1 << 31)
    return replace(params, max_tokens=None if params.max_tokens is None else params.max_tokens - done, seed=seed)


def merge(parts: Sequence[Completion]) -> Completion:
    """One completion of a request answered in ``parts`` (the first part's prompt, then each part's
    tokens in order): log-probs concatenated, versions joined; the last part's finish reason."""
    if len(parts) == 1:
        return parts[0]
    first, last = parts[0], parts[-1]
    spans = [p.policy_versions for p in parts]
    span = (VersionSpan(min(s.first for s in spans), max(s.last for s in spans))  # type: ignore[union-attr]
            if all(s is not None for s in spans) else None)
    return Completion(
        token_ids=tuple(t for p in parts for t in p.token_ids),
        logprobs=tuple(lp for p in parts for lp in p.logprobs),
        text="".join(p.text for p in parts),
        finish_reason=last.finish_reason,
        prompt_ids=first.prompt_ids,
        weight_version=last.weight_version,
        policy_versions=span,
        attempts=sum(p.attempts for p in parts),
        token_versions=join_runs(parts),
        old_kv=any(p.old_kv for p in parts),
    )


def join_runs(parts: Sequence[Completion]) -> VersionRuns | None:
    """The per-token versions of ``parts`` one after another (equal neighbours merged); None when a
    part with tokens has none."""
    runs: list[tuple[int, int]] = []
    for p in parts:
        if not p.token_ids:
            continue
        if p.token_versions is None:
            return None
        for v, n in p.token_versions:
            if runs and runs[-1][0] == v:
                runs[-1] = (v, runs[-1][1] + n)
            else:
                runs.append((v, n))
    return tuple(runs) or None


class Moves:
    """The seats of the running episodes, the requests each replica has out, and the replicas a move
    emptied, whose next load drains them first (module doc). ``client_for(rid)`` is a replica's
    (versioned) completion client."""

    def __init__(self, client_for: Callable[[int], CompletionClient], *, drain_timeout_s: float = 120.0,
                 retry_s: float = 1.0):
        self.client_for, self.drain_timeout_s, self.retry_s = client_for, drain_timeout_s, retry_s
        self._seats: dict[int, Seat] = {}
        self._out: Counter[int] = Counter()
        self._emptied: set[int] = set()
        self._orphaned: set[int] = set()  # episodes a replica's death cancelled (a move may still name them)
        self.moved = 0  # moves executed on a running episode
        self.continued = 0  # requests continued on another replica
        self.carried_tokens = 0  # tokens those had generated before they moved (kept, not sampled again)

    def client(self, traj_id: int, rid: int) -> MovingClient:
        """The client of trajectory ``traj_id``'s episode, seated on replica ``rid``."""
        seat = self._seats.setdefault(traj_id, Seat(rid))  # a move may have seated it before it started
        return MovingClient(seat, self.client_for, self._out, self._count)

    def leave(self, traj_id: int, rid: int) -> int:
        """Trajectory ``traj_id``'s episode ended: the replica it ended on (``rid`` if it had no seat)."""
        seat = self._seats.pop(traj_id, None)
        return rid if seat is None else seat.replica

    def move(self, action: MoveTrajectory, running: bool) -> bool:
        """Seat the trajectory on the target if its episode is ``running`` (else it ended, or the target
        is dead); its source drains before its next load. True when a replica's death had cancelled the
        episode before the move: the driver ends the attempt (the source's death no longer does)."""
        self._emptied.add(action.from_replica)
        if running:
            self._seats.setdefault(action.traj_id, Seat(action.to_replica)).replica = action.to_replica
            self.moved += 1
        if action.traj_id in self._orphaned:
            self._orphaned.discard(action.traj_id)
            return True
        return False

    def forget(self, rid: int, orphans: Sequence[int]) -> None:
        """Replica ``rid`` died and its episodes ``orphans`` were cancelled: a restarted engine has
        nothing to drain."""
        self._emptied.discard(rid)
        self._orphaned.update(orphans)

    async def drain(self, rid: int, control: WeightControl) -> None:
        """If a move emptied replica ``rid``: abort what it runs and wait until every request sent to
        it came back (module doc). TimeoutError after ``drain_timeout_s``."""
        if rid not in self._emptied:
            return
        self._emptied.discard(rid)
        deadline = time.monotonic() + self.drain_timeout_s
        while True:
            await control.pause(mode="abort")
            waited = time.monotonic() + self.retry_s
            while self._out[rid] and time.monotonic() < waited:
                await asyncio.sleep(0.02)
            if not self._out[rid]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self._out[rid]} request(s) on replica {rid} did not come back "
                                   f"{self.drain_timeout_s:.0f} s after it was aborted")

    def stats(self) -> dict[str, float]:
        return {"rollout/moved": float(self.moved), "rollout/moved_requests": float(self.continued),
                "rollout/moved_tokens": float(self.carried_tokens)}

    def _count(self, tokens: int) -> None:
        self.continued += 1
        self.carried_tokens += tokens
