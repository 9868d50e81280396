"""The seeds of a run's episodes and of their turns: run seed -> episode seed -> turn seed.

Training (``sao.rl``) and evaluation (``sao.evals``) seed episode ``sample`` of their ``index``-th prompt
or task with :func:`episode_seed`; the loops seed each turn's sampling with :func:`turn_seed`. Both are
pure, so a resumed run replays the seeds an uninterrupted one would have used.
"""

from __future__ import annotations


def episode_seed(seed: int, index: int, sample: int) -> int:
    """The sampling seed of one episode: distinct per (run seed, prompt or task index, sample), stable
    across resumes."""
    return (seed * 1_000_003 + index * 1_009 + sample) % 2**31


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of an episode's ``turn`` (the same scheme for token and text episodes)."""
    return None if seed is None else seed * 1000 + turn
