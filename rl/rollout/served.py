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
"""

from __future__ import annotations

from sao.rl.rollout.schedulers import UNKNOWN_VERSION, ReplicaDied
from sao.rl.weights import Served


class ServedVersions:
    """The version each of ``n`` replicas serves (module doc): 0 until a load says otherwise."""

    def __init__(self, n: int) -> None:
        self._versions = [0] * n
        self._pushed: set[int] = set()  # replicas the learner's weight sync pushes into

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
        else:
            raise TypeError(f"not an event of what a replica serves: {event!r}")

    def pushed(self, rid: int, version: int) -> bool:
        """Whether replica ``rid`` serves ``version`` already on a replica the learner pushes into: a load
        of it by the driver finds it there and has nothing to do."""
        return rid in self._pushed and self._versions[rid] == version

    def live(self, dead: set[int]) -> list[int]:
        """The versions the replicas outside ``dead`` serve (``[UNKNOWN_VERSION]`` when none is live)."""
        return [v for rid, v in enumerate(self._versions) if rid not in dead] or [UNKNOWN_VERSION]
