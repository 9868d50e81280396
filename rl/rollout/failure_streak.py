"""When every attempt fails: an engine that answers every request with an error (a wrong model name,
a broken chat template, a full disk) is alive to the replica watcher, so the scheduler keeps
re-queueing the requests and, once their failures are used up, admitting fresh prompts in their place,
forever. :class:`FailureStreak` counts the attempts that failed since the last one that did not; when
``limit`` fail in a row the rollout stops with their first causes instead of running on without a batch.
"""

from __future__ import annotations

from sao.rl.errors import RolloutFailing

__all__ = ["FailureStreak", "RolloutFailing"]


class FailureStreak:
    """Failed attempts since the last one that ended well (module doc)."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit, self.count = limit, 0
        self.causes: list[str] = []  # the streak's distinct causes, first seen first (3 at most)

    def ended(self, cause: str | None) -> RolloutFailing | None:
        """One attempt ended (``cause``: why it failed; None: it did not). The error to stop with, once
        ``limit`` in a row have failed."""
        if cause is None:
            self.count, self.causes = 0, []
            return None
        self.count += 1
        if cause not in self.causes and len(self.causes) < 3:
            self.causes.append(cause)
        if self.count < self.limit:
            return None
        return RolloutFailing(f"the last {self.count} attempts all failed and none succeeded in between; first "
                              f"causes: {self.causes}. They are recorded in trajectories.jsonl; fix the cause and "
                              "rerun with resume=true")
