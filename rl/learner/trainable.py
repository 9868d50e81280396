"""Which episodes a learner may train on: those that ran AND were graded.

An episode can end with ``status="ok"`` (the loop ran it to an end) and still carry no verdict: its
grading hit an infrastructure error (``info["error"]``: a grading container that died, a missing
image) or could not judge anything (``info["eval_error"]``: the image cannot run its tests). Its
reward of 0.0 is then no reward at all, and training on it would teach the policy that its answer
was wrong. Every rollout source sorts episodes with :func:`failure`, so these are recorded with the
failed ones (and retried where the source retries) instead of being trained on.
"""

from __future__ import annotations

from sao.agents import Trajectory


def failure(t: Trajectory) -> str | None:
    """Why ``t`` must not be trained on (None: it may)."""
    if t.status != "ok":
        return t.error or f"status {t.status}"
    if t.info.get("error"):
        return f"grading failed (infrastructure): {t.info['error']}"
    if t.info.get("eval_error"):
        return f"grading could not judge the episode: {t.info['eval_error']}"
    return None
