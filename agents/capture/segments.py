"""An episode's tokens from its captured calls: :func:`assemble` -> :class:`Assembled`.

Calls are taken in arrival order; failed ones are left out (their records stay on the session). A
token-mode call whose prompt ids extend the current segment (the previous call's prompt and completion)
EXACTLY merges into it: the tokens between are observation tokens (mask 0, log-prob 0), then its sampled
tokens (mask 1, the engine's log-probs). Otherwise it starts a new :class:`~sao.agents.records.Segment`
holding its whole prompt, and the segment records why:

* "prefix_changed": the prompt differs from the segment at position ``at`` (from the segment's start):
  the agent edited or compacted its history, or the template re-rendered a turn;
* "history_shorter": the prompt is a strict prefix of the segment: the agent dropped turns, or asked again.

Nothing is re-tokenized: every id is one the engine was given or sampled. Text-mode calls (a hosted
endpoint) assemble into a text-mode result: no tokens, the turns' usage counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sao.envs import Message

from ..records import Segment, TurnRecord
from .calls import CapturedCall

__all__ = ["Assembled", "CaptureStats", "assemble"]


@dataclass(frozen=True)
class CaptureStats:
    """How an episode's calls assembled. ``calls``: served calls; ``merged``: those that extended the
    previous one; ``split``: those that started a new segment after the first, counted per reason in
    ``split_reasons``; ``pinned_calls``: calls whose sampling settings the rule overrode; ``failed_calls``:
    calls the upstream failed (not in the tokens)."""

    calls: int = 0
    merged: int = 0
    split: int = 0
    split_reasons: dict[str, int] = field(default_factory=dict)
    pinned_calls: int = 0
    failed_calls: int = 0

    def __add__(self, other: CaptureStats) -> CaptureStats:
        """The counts of two episodes together (sums, and the reasons' counts summed per reason)."""
        reasons = Counter(self.split_reasons) + Counter(other.split_reasons)
        return CaptureStats(calls=self.calls + other.calls, merged=self.merged + other.merged,
                            split=self.split + other.split, split_reasons=dict(sorted(reasons.items())),
                            pinned_calls=self.pinned_calls + other.pinned_calls,
                            failed_calls=self.failed_calls + other.failed_calls)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaptureStats:
        """The stats a record holds (:meth:`as_json`); a missing count reads as 0."""
        return cls(calls=int(d.get("calls", 0)), merged=int(d.get("merged", 0)), split=int(d.get("split", 0)),
                   split_reasons={str(k): int(v) for k, v in (d.get("split_reasons") or {}).items()},
                   pinned_calls=int(d.get("pinned_calls", 0)), failed_calls=int(d.get("failed_calls", 0)))


@dataclass(frozen=True)
class Assembled:
    """An episode's tokens and turns, ready for a :class:`~sao.agents.records.Trajectory` (same meanings:
    ``token_ids``/``action_mask``/``logprobs`` [T], ``turns``, ``segments``), its final ``messages`` (the
    last call's history and reply), ``mode`` ("tokens" or "text") and ``stats``."""

    token_ids: tuple[int, ...]
    action_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    turns: tuple[TurnRecord, ...]
    segments: tuple[Segment, ...]
    messages: tuple[Message, ...]
    mode: str
    stats: CaptureStats


def assemble(calls: Sequence[CapturedCall]) -> Assembled:
    """The episode of ``calls`` (module doc). Mixed token and text calls are a ValueError."""
    ordered = sorted(calls, key=lambda c: c.index)
    served = [c for c in ordered if c.served]
    modes = {c.mode for c in served}
    if len(modes) > 1:
        raise ValueError("a session's calls are all token mode or all text mode, not both")
    pinned = sum(1 for c in ordered if c.pinned)
    failed = len(ordered) - len(served)
    messages = (*served[-1].messages, served[-1].reply) if served else ()
    if modes == {"text"}:
        turns = tuple(TurnRecord(0, 0, c.chat.finish_reason, c.chat.weight_version, c.t_start, c.t_end,  # type: ignore[union-attr]
                                 attempts=c.chat.attempts, prompt_tokens=c.chat.prompt_tokens,  # type: ignore[union-attr]
                                 completion_tokens=c.chat.completion_tokens) for c in served)  # type: ignore[union-attr]
        return Assembled((), (), (), turns, (), messages, "text",  # type: ignore[arg-type]
                         CaptureStats(calls=len(served), pinned_calls=pinned, failed_calls=failed))
    builder = _Builder()
    for call in served:
        builder.add(call)
    segments = builder.segments
    stats = CaptureStats(calls=len(served), merged=builder.merged, split=max(len(segments) - 1, 0),
                         split_reasons=dict(Counter(s.reason for s in segments[1:])), pinned_calls=pinned,
                         failed_calls=failed)
    return Assembled(tuple(builder.ids), tuple(builder.mask), tuple(builder.logprobs), tuple(builder.turns),
                     tuple(segments), messages, "tokens", stats)  # type: ignore[arg-type]


class _Builder:
    """The growing token arrays; the current segment is ``ids[start:]``."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.turns: list[TurnRecord] = []
        self.starts: list[tuple[int, str, int | None]] = []  # each segment's (start, reason, at)
        self.start = 0
        self.merged = 0

    def add(self, call: CapturedCall) -> None:
        prompt, completion = call.prompt_ids, call.completion
        assert prompt is not None and completion is not None
        current = self.ids[self.start:]
        if self.starts and prompt[:len(current)] == tuple(current):
            self.merged += 1
            new = prompt[len(current):]
        else:
            reason, at = _why(current, prompt) if self.starts else ("first", None)
            self.start = len(self.ids)
            self.starts.append((self.start, reason, at))
            new = prompt
        self.ids += new
        self.mask += [0] * len(new)
        self.logprobs += [0.0] * len(new)
        turn_at = len(self.ids)
        self.ids += completion.token_ids
        self.mask += [1] * len(completion.token_ids)
        self.logprobs += completion.logprobs
        self.turns.append(TurnRecord(prompt_len=turn_at, completion_len=len(completion.token_ids),
                                     finish_reason=completion.finish_reason, weight_version=completion.weight_version,
                                     t_start=call.t_start, t_end=call.t_end, attempts=completion.attempts,
                                     policy_versions=completion.policy_versions,
                                     token_versions=completion.token_versions, old_kv=completion.old_kv))

    @property
    def segments(self) -> list[Segment]:
        ends = [start for start, _, _ in self.starts[1:]] + [len(self.ids)]
        return [Segment(start, end, reason, at) for (start, reason, at), end in zip(self.starts, ends)]


def _why(current: Sequence[int], prompt: Sequence[int]) -> tuple[str, int | None]:
    """Why ``prompt`` does not extend ``current``: where it first differs, or that it is shorter."""
    for i, (a, b) in enumerate(zip(current, prompt)):
        if a != b:
            return "prefix_changed", i
    return "history_shorter", len(prompt)
