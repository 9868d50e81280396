"""The prompts a rollout driver has admitted and the learner has not taken yet.

:class:`OpenPrompts` is the scheduler's :class:`~sao.rl.rollout.schedulers.PromptSource` over the run's task
stream: group id = the prompt's index in the stream, so a request and its retries map back to one
task. A checkpoint holds the open groups (:func:`ref_to_dict`); a resumed run admits them first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict
from typing import Any

from sao.rl.prompts.tasks import PromptRef
from sao.rl.rollout.schedulers import Prompt


class OpenPrompts:
    """``refs``: the groups admitted and not yet closed. A group closes when the learner takes a
    trajectory of it (groups are trained whole) or when it is recorded failed. ``replay``: open
    groups of a checkpoint, admitted again (first) by a resumed run.
    """

    def __init__(self, tasks: Any):
        self.tasks = tasks
        self.refs: dict[int, PromptRef] = {}  # open groups, in admission order
        self.replay: deque[PromptRef] = deque()

    def next_group(self, size: int) -> tuple[Prompt, ...]:
        ref = self.replay.popleft() if self.replay else self.tasks.take(1)[0]
        self.refs[ref.index] = ref
        family = getattr(ref, "family", None) or "default"
        return tuple(Prompt(ref.index, i, family) for i in range(size))

    def reopen(self, refs: list[PromptRef]) -> None:
        """A resumed run: ``refs`` (a checkpoint's open groups) are admitted again, first; nothing else is open."""
        self.refs.clear()
        self.replay = deque(refs)

    def close(self, group_id: int) -> None:
        self.refs.pop(group_id, None)

    def open(self) -> list[PromptRef]:
        """Open groups, then those still waiting to be replayed (a checkpoint's pending prompts)."""
        return [*self.refs.values(), *self.replay]


def ref_to_dict(ref: PromptRef) -> dict[str, Any]:
    return asdict(ref)  # type: ignore[call-overload]


def ref_from_dict(data: dict[str, Any]) -> PromptRef:
    if "phase" in data:  # a ScheduledPrompt (online-learning schedules)
        from sao.rl.prompts.curriculum import ScheduledPrompt

        return ScheduledPrompt(**data)  # type: ignore[return-value]
    return PromptRef(**data)
