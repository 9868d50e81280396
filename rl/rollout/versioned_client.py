"""The policy version of each turn: a completion client that stamps what its replica served.

A sync can land mid-request (``pause_mode="keep"`` lets the request continue on the new weights),
so every turn records the replica's version when its request was sent and when it came back. An
engine on the token route (:mod:`sao.agents.clients.generate`) also says which version sampled each token; runs
within that span are kept (``token_versions``), and a turn that no sync touched is all one version. The
oldest version is the trajectory's for staleness (METHOD.md 1.10).

It also flags a turn whose request overlapped a time when the replica's KV cache held blocks computed
with older weights (``old_kv``): a load whose prefix-cache reset the engine refused, until a retry
succeeds (:class:`~sao.rl.rollout.served.ServedVersions`). Such a turn's later tokens carry the new
version but may have been computed over an old-weights prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from sao.agents import Completion, Trajectory, VersionSpan
from sao.agents.clients import CompletionClient, SamplingParams
from sao.agents.records import VersionRuns
from sao.rl.rollout.served import CLEAN, KVState

log = logging.getLogger(__name__)


class VersionedClient:
    """Stamps each completion of ``client`` with its replica's version (``version()``, read from
    :class:`~sao.rl.rollout.served.ServedVersions`) at request time and at answer time, and with
    ``old_kv`` when ``kv()`` (the replica's :class:`~sao.rl.rollout.served.KVState`) says its request
    overlapped a time of old-weights KV blocks."""

    def __init__(self, client: CompletionClient, version: Callable[[], int],
                 kv: Callable[[], KVState] = lambda: CLEAN):
        self.client, self.version, self.kv = client, version, kv

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        before, kv_before = self.version(), self.kv()
        completion = await self.client.complete(prompt_ids, params)
        span = VersionSpan(before, self.version())
        return replace(completion, policy_versions=span, token_versions=runs_within(completion, span),
                       old_kv=completion.old_kv or kv_before.overlapped(self.kv()))


def runs_within(completion: Completion, span: VersionSpan) -> VersionRuns | None:
    """The per-token versions of ``completion``: the engine's runs when they lie within ``span`` (its
    labels are the versions this replica loaded), all ``span.first`` when no sync landed in it, else
    unknown (None: the span stands for the turn)."""
    runs = completion.token_versions
    if runs is not None and all(span.first <= v <= span.last for v, _ in runs):
        return runs
    if runs is not None:
        log.warning("engine version runs %s outside the replica's span %d-%d; keeping the span", runs,
                    span.first, span.last)
    if span.first == span.last and completion.token_ids:
        return ((span.first, len(completion.token_ids)),)
    return None


def turn_versions(trajectory: Trajectory, fallback: int) -> tuple[int, ...]:
    """Every version a trajectory's turns were sampled by (per turn: its token runs' versions when
    known, else its span's ends), in turn order; ``(fallback,)`` when no turn has one."""
    out: list[int] = []
    for turn in trajectory.turns:
        out += turn.versions
    return tuple(out) or (fallback,)


def version_metrics(trajectories: Sequence[Trajectory], step: int) -> dict[str, float]:
    """What per-token versions show about a trained batch (turns that carry runs only; none: {}):
    ``rollout/token_staleness_mean`` (``step`` minus the version of each sampled token, averaged over
    tokens), ``rollout/split_turns`` (turns a weight update landed in: more than one run) and
    ``rollout/reprefill_tokens`` (what continuing them cost: at each split the engine re-computed the
    turn's prompt and the tokens sampled before it on the new weights)."""
    tokens = staleness = split = reprefill = 0
    for trajectory in trajectories:
        for turn in trajectory.turns:
            runs = turn.token_versions
            if not runs:
                continue
            tokens += sum(n for _, n in runs)
            staleness += sum((step - v) * n for v, n in runs)
            if len(runs) > 1:
                split += 1
                done = 0
                for _, n in runs[:-1]:
                    done += n
                    reprefill += turn.prompt_len + done
    if not tokens:
        return {}
    return {"rollout/token_staleness_mean": staleness / tokens, "rollout/split_turns": float(split),
            "rollout/reprefill_tokens": float(reprefill)}
