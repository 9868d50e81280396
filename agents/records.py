"""Typed records that cross the boundary between rollout and learner.

A :class:`Trajectory` holds ONE exact token sequence for the whole episode: the first prompt,
then each turn's sampled tokens (action tokens) and the environment's reply rendered through the
chat template (observation tokens). Turn ``k``'s prompt is exactly ``token_ids[:turns[k].prompt_len]``,
the bytes the engine saw, so the learner never re-tokenizes text and cannot drift from what was
sampled. Shapes below use ``T`` for the number of tokens.

A trajectory in *text* mode (``mode="text"``: an endpoint that returns no token ids, through the chat
API) has no tokens at all: ``token_ids``, ``action_mask`` and ``logprobs`` are empty, ``messages``
holds the text turns and each :class:`TurnRecord` the usage the API reported. Such a trajectory
can be graded and summarized like any other, but it is not ``trainable``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from sao.envs import Message

SCHEMA_VERSION = 1
MODES = ("tokens", "text")
# Why a failed episode failed (Trajectory.failure): the machinery (engine, container, OS; running it
# again may succeed), the environment's own code (it raised, or broke Gymnasium's return contract;
# it would fail the same way again; see sao.agents.loop.env_calls), or an external agent (it raised,
# hung past its timeout, or in training never called the model; sao.agents.external.runner).
INFRA_ERROR, ENV_ERROR, AGENT_ERROR = "infra_error", "env_error", "agent_error"
FAILURES = (INFRA_ERROR, ENV_ERROR, AGENT_ERROR)


@dataclass(frozen=True)
class VersionSpan:
    """The policy versions that served one model call: ``first`` when its request was sent, ``last``
    when its answer came back. They differ when a weight update landed mid-request (the engine
    kept generating on the new weights). Integers, stamped by whoever tracks the versions."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if self.last < self.first:
            raise ValueError(f"a version span runs forwards, not {self.first} -> {self.last}")

    @classmethod
    def of(cls, version: int) -> VersionSpan:
        return cls(version, version)


# The policy version of every sampled token of a model call, run-length encoded: ((version, tokens), ...)
# in token order (AReaL's per-token ``output_versions``). A weight update that lands mid-request (the
# engine paused in "keep" mode, its requests preempted and continued on the new weights) splits a turn
# into two runs. vLLM's token route reports them (``weight_versions`` spans); see sao.agents.clients.generate.
VersionRuns = tuple[tuple[int, int], ...]


def check_runs(runs: VersionRuns, tokens: int) -> VersionRuns:
    """``runs`` as tuples, or ValueError: whole versions, runs of >= 1 token covering exactly ``tokens``."""
    out = tuple((int(v), int(n)) for v, n in runs)
    if any(n < 1 for _, n in out) or sum(n for _, n in out) != tokens:
        raise ValueError(f"version runs {out} do not cover {tokens} tokens with runs of at least one")
    return out


@dataclass(frozen=True)
class Completion:
    """What the engine returned for one request. ``logprobs[i]`` belongs to ``token_ids[i]``."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str  # "stop" | "length" | ...
    prompt_ids: tuple[int, ...] | None = None  # the prompt as the server echoed it, when it does
    weight_version: str | None = None  # the engine's weight version label, when it reports one
    policy_versions: VersionSpan | None = None  # the versions that served it, when the caller tracks them
    attempts: int = 1  # HTTP attempts this request took, retries included
    token_versions: VersionRuns | None = None  # the policy version of each sampled token, when known
    # some of its tokens may have been computed over KV blocks left by older weights (TurnRecord.old_kv)
    old_kv: bool = False

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.logprobs)} log-probs")
        if self.token_versions is not None:
            object.__setattr__(self, "token_versions", check_runs(self.token_versions, len(self.token_ids)))


@dataclass(frozen=True)
class ChatCompletion:
    """What a chat endpoint returned for one request (text mode): no token ids, no log-probs.

    ``tool_calls`` are the API's native tool calls as it sent them (OpenAI format, unchecked);
    ``prompt_tokens``/``completion_tokens`` its ``usage``, None when it reported none.
    """

    text: str
    finish_reason: str  # "stop" | "length" | "tool_calls" | ...
    tool_calls: tuple[dict[str, Any], ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    weight_version: str | None = None
    attempts: int = 1  # HTTP attempts this request took, retries included


@dataclass(frozen=True)
class TurnRecord:
    """Metadata of one model call. Its completion is ``token_ids[prompt_len:prompt_len + completion_len]``.

    In text mode there are no token positions (``prompt_len == completion_len == 0``);
    ``prompt_tokens``/``completion_tokens`` are then the API's usage counts (None where it gave none).
    """

    prompt_len: int
    completion_len: int
    finish_reason: str
    weight_version: str | None
    t_start: float  # seconds since the episode started
    t_end: float
    attempts: int = 1  # HTTP attempts of this call's request, retries included
    prompt_tokens: int | None = None  # text mode: usage.prompt_tokens
    completion_tokens: int | None = None  # text mode: usage.completion_tokens
    policy_versions: VersionSpan | None = None  # the policy versions that sampled it, when tracked
    token_versions: VersionRuns | None = None  # the policy version of each of its tokens, when known
    # Its request overlapped a time when its replica's KV cache held blocks computed with older weights
    # (a weight load whose prefix-cache reset the engine refused, rollout.keep_kv; sao.rl.rollout.served):
    # some of its tokens, labelled with the new version, may have been computed over an old-weights prefix.
    old_kv: bool = False

    def __post_init__(self) -> None:
        if self.token_versions is not None:
            object.__setattr__(self, "token_versions", check_runs(self.token_versions, self.completion_len))

    @property
    def versions(self) -> tuple[int, ...]:
        """The policy versions that sampled it, oldest first: its token runs' when known, else its span's
        ends, else none."""
        if self.token_versions is not None:
            return tuple(sorted({v for v, _ in self.token_versions}))
        span = self.policy_versions
        if span is None:
            return ()
        return (span.first,) if span.first == span.last else (span.first, span.last)


@dataclass(frozen=True)
class RolloutMeta:
    """Where a training run's rollout got a trajectory; stamped by its rollout source (an evaluation's
    trajectories have none). Written to ``trajectories.jsonl`` as the nested ``rollout`` object.

    prompt_index:   the prompt's position in the run's task stream (one draw of a task).
    policy_version: the oldest policy version that sampled it (staleness counts from it).
    replica, attempt, traj_id: the engine replica, the prompt's attempt (0 first, +1 per re-queue)
                    and the scheduler's id of it; None where the source has no such notion (``sync``).
    train_step:     the optimizer step being sampled for when it ended (0: critic pretraining); the
                    trainer sets it when it records the trajectory.
    warmup, probe:  sampled outside the schedule for critic warm-up, or to measure, never to train.
    """

    prompt_index: int
    policy_version: int
    replica: int | None = None
    attempt: int | None = None
    traj_id: int | None = None
    train_step: int | None = None
    warmup: bool = False
    probe: bool = False


@dataclass(frozen=True)
class Segment:
    """One trainable piece of an episode's tokens: ``token_ids[start:end]``.

    An episode played through the capture proxy (sao.agents.capture) is one token sequence only while
    each model call's prompt extends the previous call's prompt and completion exactly. When it does not
    (the agent edited or compacted its history, or the template re-rendered a turn) a new segment starts,
    and ``reason`` says why: "first" (the episode's first), "prefix_changed" (the prompt differs from the
    previous sequence at position ``at``, counted from the segment's start), "history_shorter" (the prompt
    is a strict prefix of the previous sequence: the agent dropped turns or asked again). Within a segment,
    a turn's prompt is ``token_ids[start:turn.prompt_len]``.
    """

    start: int
    end: int
    reason: str
    at: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"a segment spans at least one token from a position >= 0, not [{self.start}, {self.end})")


@dataclass(frozen=True)
class Trajectory:
    """One episode, ready for a learner.

    token_ids:   [T] the whole episode's tokens.
    action_mask: [T] 1 where the policy sampled the token, 0 for prompt/observation tokens.
    logprobs:    [T] the sampling engine's log-prob at action tokens, 0.0 elsewhere.
    reward:      the environment's total reward (given at the last action token).
    status:      "ok" (the episode ran to an end state or a limit) or "failed" (``error`` says why;
                 an engine failure, say). A failed episode is data: it is recorded, never dropped.
    mode:        "tokens" (the token loop; the three arrays above are exact) or "text" (a chat endpoint
                 without token ids; the arrays are empty, see the module docstring). Records written
                 before the field existed read as "tokens".
    rollout:     a training rollout's metadata (:class:`RolloutMeta`); None outside training.
    failure:     why a failed episode failed, one of :data:`FAILURES` ("infra_error", "env_error" or
                 "agent_error": an external agent's own failure); None for an "ok" one. A failed record written before the field existed reads as None
                 and counts as an infrastructure error.
    segments:    the :class:`Segment` s that the tokens are the concatenation of, in order, covering
                 ``[0, T)``; empty: one segment (the token loop's episodes, and records written before the
                 field existed). A learner trains on each segment as a sample of its own.
    """

    episode_id: str
    env: str
    task_id: str
    sample: int
    seed: int | None
    token_ids: tuple[int, ...]
    action_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    turns: tuple[TurnRecord, ...]
    messages: tuple[Message, ...]
    reward: float
    terminated: bool
    truncated: bool
    status: str
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    mode: str = "tokens"
    rollout: RolloutMeta | None = None
    failure: str | None = None
    segments: tuple[Segment, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if self.segments:
            bounds = [(s.start, s.end) for s in self.segments]
            if bounds[0][0] != 0 or bounds[-1][1] != n or any(a[1] != b[0] for a, b in zip(bounds, bounds[1:])):
                raise ValueError(f"segments {bounds} do not cover the {n} tokens in order")
        if len(self.action_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"token_ids, action_mask and logprobs differ in length "
                             f"({n}, {len(self.action_mask)}, {len(self.logprobs)})")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "text" and n:
            raise ValueError(f"a text-mode trajectory has no tokens, got {n}")
        if self.failure is not None and (self.failure not in FAILURES or self.status == "ok"):
            raise ValueError(f"failure must be None or, for a failed episode, one of {FAILURES}; got "
                             f"{self.failure!r} with status {self.status!r}")

    @property
    def trainable(self) -> bool:
        """Whether a learner can use it: only token-mode trajectories carry the sampled tokens and log-probs."""
        return self.mode == "tokens"

    @property
    def env_error(self) -> bool:
        """Whether it failed in the environment's own code (it would fail the same way again)."""
        return self.status == "failed" and self.failure == ENV_ERROR

    @property
    def agent_error(self) -> bool:
        """Whether an external agent failed it (raised, timed out, never called the model)."""
        return self.status == "failed" and self.failure == AGENT_ERROR

    @property
    def correct(self) -> bool:
        return bool(self.info.get("correct", False))

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)

    @property
    def num_tool_calls(self) -> int:
        """The well-formed tool calls its actions made (a malformed one, in ``invalid_tool_calls``, not counted)."""
        return sum(len(m.get("tool_calls") or ()) for m in self.messages if m.get("role") == "assistant")

    @property
    def generated_tokens(self) -> int:
        """Tokens the model generated: action tokens (tokens mode), or the sum of the API's reported
        completion tokens (text mode; a turn without usage counts 0)."""
        if self.mode == "text":
            return sum(t.completion_tokens or 0 for t in self.turns)
        return self.num_action_tokens

    @property
    def weight_versions(self) -> tuple[str | None, ...]:
        """The engine's version label of each turn (None where it reported none)."""
        return tuple(t.weight_version for t in self.turns)

    @property
    def policy_versions(self) -> tuple[VersionSpan | None, ...]:
        """The policy versions that sampled each turn (None where untracked)."""
        return tuple(t.policy_versions for t in self.turns)

    def to_json(self) -> str:
        record = asdict(self)
        record["schema"] = SCHEMA_VERSION
        return json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str).translate(_LINE_BREAKS)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        record = json.loads(line)
        record.pop("schema", None)
        record["turns"] = tuple(_turn_from_dict(t) for t in record["turns"])
        if record.get("rollout") is not None:
            record["rollout"] = RolloutMeta(**record["rollout"])
        record["segments"] = tuple(Segment(**s) for s in record.get("segments") or ())
        for key in ("token_ids", "action_mask", "logprobs", "messages"):
            record[key] = tuple(record[key])
        return cls(**record)


# Model text can hold U+0085, U+2028 and U+2029, which json.dumps(ensure_ascii=False) leaves raw inside a
# string and str.splitlines() (and readers built on it) takes for line breaks: a soak read 7 whole
# records as torn. Escaped, every record is one line for any reader; json.loads gives the same text.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with values JSON can hold; anything else becomes its ``str``."""
    return {k: v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v) for k, v in info.items()}


def _turn_from_dict(data: dict[str, Any]) -> TurnRecord:
    span = data.get("policy_versions")
    return TurnRecord(**{**data, "policy_versions": VersionSpan(**span) if span is not None else None})
