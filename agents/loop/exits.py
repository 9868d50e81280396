"""Why an episode ended: ``info["exit_status"]``, one word in every trajectory's info.

:data:`EXIT_STATUSES` is the vocabulary, with what each word means. The loops set it when the episode
ends (:func:`exit_status`): a failure first; then the environment's own word when the environment ended
the episode (an SWE environment names ``submitted``, ``format_errors``, ``max_steps``, and the limit it
was given by ``finish_cut``); then the loop limit that cut it (the same word as ``info["truncated_by"]``,
which stays: a math answer cut by the token budget is ``max_tokens``); then ``terminated`` or
``truncated`` for an environment that names none.

Graded or not. An episode cut by a limit of the loop (:data:`LOOP_LIMITS`) is finished by the
environment when it offers :class:`~sao.envs.capabilities.CutGrading` (the SWE environments take the
diff and grade it, or with ``autosubmit=False`` score it as an empty patch); its reward is then final,
and the trajectory is recorded ``terminated`` and ``truncated`` both, so a learner does not bootstrap
it. An environment without it keeps the episode unfinished: ``truncated`` alone, no reward.
"""

from __future__ import annotations

from typing import Any

from ..records import AGENT_ERROR, ENV_ERROR, INFRA_ERROR

LOOP_LIMITS = ("max_turns", "max_tokens", "max_tokens_per_turn", "context")
"""The loop's limits (``info["truncated_by"]``): model calls, the episode's token budget, one turn's
token cap, the model's context window."""

LIMITS = (*LOOP_LIMITS, "max_steps")
"""Every limit that can cut an episode: the loop's, and the environment's own step limit."""

EXIT_STATUSES: dict[str, str] = {
    "submitted": "the agent ended the episode itself (SWE: the submit tool); graded",
    "format_errors": "the environment ended it after too many replies without a usable tool call; graded",
    "max_steps": "the environment's own step limit cut it (SWE: max_steps, --max-steps); graded",
    "max_turns": "the loop's turn limit cut it (--max-turns)",
    "max_tokens": "the episode's budget of generated tokens cut it (--max-tokens)",
    "max_tokens_per_turn": "one turn's token cap cut the answer that ended it",
    "context": "the model's context window cut it (--max-model-len, or an engine's context overflow)",
    "grade_only": "a given prediction graded without an agent (--grade-only)",
    "terminated": "an environment that names no exit status ended it",
    "truncated": "an environment that names no exit status cut it",
    ENV_ERROR: "the environment's own code raised, or broke Gymnasium's contract (failed)",
    INFRA_ERROR: "the infrastructure failed: engine, container, Docker, grading machinery",
    "agent_returned": "an external agent returned its answer or patch; graded by the environment",
    AGENT_ERROR: "an external agent raised (or its process died without a result) (failed)",
    "agent_timeout": "an external agent ran past its timeout and was killed, with its processes (failed)",
    "no_calls": "in training, an external agent never called the model (failed)",
}
"""Every exit status, with its meaning. A loop limit's episode is graded (with ``autosubmit``, an empty
patch without) when the environment offers :class:`~sao.envs.capabilities.CutGrading`."""

AGENT_FAILURES = (AGENT_ERROR, "agent_timeout", "no_calls")
"""The exit statuses of an episode that an external agent failed (``failure="agent_error"``)."""


def exit_status(*, status: str, failure: str | None, truncated_by: str | None, info: dict[str, Any],
                terminated: bool, truncated: bool) -> str:
    """The exit status of an episode that ended so (module doc): a failure, the environment's own word
    when it ended the episode (``terminated`` or ``truncated``: its flags), the loop limit that cut it,
    else ``terminated`` or ``truncated``."""
    if status != "ok":
        named = info.get("exit_status")  # an external agent's failure names its cause
        return named if failure == AGENT_ERROR and named in AGENT_FAILURES else failure or INFRA_ERROR
    named = info.get("exit_status") if terminated or truncated else None
    if isinstance(named, str) and named:
        return named
    if truncated_by is not None:
        return truncated_by
    return "terminated" if terminated else "truncated"


def with_exit_status(info: dict[str, Any], **ended: Any) -> dict[str, Any]:
    """``info`` with its ``exit_status`` set as :func:`exit_status` names it from ``ended``."""
    return {**info, "exit_status": exit_status(info=info, **ended)}
