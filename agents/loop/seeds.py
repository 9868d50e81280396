"""The seeds of a run's episodes and of their turns: run seed -> episode seed -> turn seed.

Training (``sao.rl``) seeds episode ``sample`` of its ``index``-th prompt with :func:`episode_seed`.
Evaluation (``sao.evals``) seeds it by the task's id with :func:`task_seed`, so that an instance keeps
its seed whatever selection of the benchmark it is evaluated in (``--instance-ids``, ``--filter``,
``--shuffle``, ``--slice``, ``--limit``). The loops seed each turn's sampling with :func:`turn_seed`.
All are pure, so a resumed run replays the seeds an uninterrupted one would have used.
"""

from __future__ import annotations

import hashlib


def episode_seed(seed: int, index: int, sample: int) -> int:
    """The sampling seed of one episode: distinct per (run seed, prompt or task index, sample), stable
    across resumes."""
    return (seed * 1_000_003 + index * 1_009 + sample) % 2**31


def task_seed(seed: int, task_id: str, sample: int) -> int:
    """The sampling seed of one episode of the task ``task_id``: a function of (run seed, task id,
    sample) only, the same in every process and Python version (a BLAKE2b digest, not ``hash()``,
    which is salted per process), in [0, 2^31)."""
    key = f"{seed}\x00{task_id}\x00{sample}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 2**31


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of an episode's ``turn`` (the same scheme for token and text episodes)."""
    return None if seed is None else seed * 1000 + turn
