"""What each engine replica serves: the one record of a replica's weights version, and who writes it.

The engine's weights change at the moment a load of them resumes it: only the driver sees that
moment (a load's ``before_resume``), or the learner's weight sync where it pushes the version itself
(``rollout=sync``). So the truth of a replica's version lives here, on the driver's side, and is
written only by applying events:

- :class:`~sao.rl.weights.load.Served` (``replica i serves version v``): the driver's own load, or the
  learner's push (``pushed=True``), which reports it as an event instead of writing the table;
- :class:`~sao.rl.rollout.schedulers.ReplicaDied` (from the replica's watch): it serves unknown weights
  until a load gives it a version again (a restarted engine starts from the weights it was launched with).

The scheduler's record of each replica (:class:`~sao.rl.rollout.schedulers.replicas.ReplicaRecord`) is
the other view, a plan: what it asked for and was told. It follows this one through the events the
driver sends it (``SyncDone`` after the load, ``ReplicaDied``, ``ReplicaRestarted``); it cannot be the
truth, because it hears of a load only after the engine has resumed on it (turns that run in between
are stamped from here, :mod:`sao.rl.rollout.versioned_client`), and it does not exist before the
schedule starts (warm-up batches and the start version's load).

It also records whether a replica's KV cache may hold blocks computed with older weights: after a
load whose prefix-cache reset the engine refused (vLLM refuses while blocks are in use, which is
always the case under ``rollout.keep_kv`` with requests in flight), until a retry of the reset
succeeds or the replica dies. The rule: nothing waits for the reset; every turn whose request
overlapped such a time is flagged ``old_kv`` (:class:`KVState`), the driver retries the reset, warns
(the first refusal per replica; later ones are logged at info), and counts them (``rollout/prefix_reset_refused``, ``rollout/old_kv_turns``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sao.rl.rollout.schedulers import UNKNOWN_VERSION, ReplicaDied
from sao.rl.weights import Served


@dataclass(frozen=True)
class KVState:
    """A replica's KV cache as a request sees it when it is sent and when it comes back: whether it may
    hold old-weights blocks now (``old``), and how many times that began so far (``marks``)."""

    old: bool
    marks: int

    def overlapped(self, later: KVState) -> bool:
        """Whether a request sent at ``self`` and answered at ``later`` overlapped a time of old-weights
        blocks: one at either end, or one that began and ended in between."""
        return self.old or later.old or later.marks != self.marks


CLEAN = KVState(False, 0)


class ServedVersions:
    """The version each of ``n`` replicas serves, and the state of its KV cache (module doc): version 0
    and clean until a load says otherwise."""

    def __init__(self, n: int) -> None:
        self._versions = [0] * n
        self._pushed: set[int] = set()  # replicas the learner's weight sync pushes into
        self._kv = [CLEAN] * n
        self.refused_resets = 0  # loads whose prefix-cache reset the engine refused, over the run

    def __getitem__(self, rid: int) -> int:
        return self._versions[rid]

    def __len__(self) -> int:
        return len(self._versions)

    def apply(self, event: Served | ReplicaDied) -> None:
        """Record what ``event`` says a replica serves now."""
        if isinstance(event, Served):
            self._versions[event.replica] = event.version
            if event.pushed:
                self._pushed.add(event.replica)
        elif isinstance(event, ReplicaDied):
            self._versions[event.replica] = UNKNOWN_VERSION
            self.kv_reset(event.replica)  # a restarted engine starts with an empty cache
        else:
            raise TypeError(f"not an event of what a replica serves: {event!r}")

    def kv(self, rid: int) -> KVState:
        """Replica ``rid``'s KV cache now (:class:`KVState`)."""
        return self._kv[rid]

    def old_kv(self, rid: int) -> None:
        """Replica ``rid`` resumed on new weights with its prefix cache not reset: old-weights blocks."""
        self._kv[rid] = KVState(True, self._kv[rid].marks + 1)
        self.refused_resets += 1

    def kv_reset(self, rid: int) -> None:
        """Replica ``rid``'s prefix cache was reset (or the engine restarted): no old-weights blocks."""
        self._kv[rid] = KVState(False, self._kv[rid].marks)

    def pushed(self, rid: int, version: int) -> bool:
        """Whether replica ``rid`` serves ``version`` already on a replica the learner pushes into: a load
        of it by the driver finds it there and has nothing to do."""
        return rid in self._pushed and self._versions[rid] == version

    def live(self, dead: set[int]) -> list[int]:
        """The versions the replicas outside ``dead`` serve (``[UNKNOWN_VERSION]`` when none is live)."""
        return [v for rid, v in enumerate(self._versions) if rid not in dead] or [UNKNOWN_VERSION]
