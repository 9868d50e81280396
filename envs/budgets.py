"""What one episode of a benchmark may spend: one :class:`Budgets` record per registry entry.

The record is declared once, on the benchmark's :class:`~sao.envs.registry.EnvEntry`, and read by
everything that sizes an episode: ``sao-eval``'s budget flags default to it (an explicit flag wins),
``sao-train``'s ``conf/env/`` files of the benchmarks take their limits from it (the ``sao.budget``
resolver), and the SWE factories take their default ``max_steps`` from it. A token limit of None means
no limit beyond the model's context: a turn may then use whatever the context has left.

These are the benchmarks' own budgets, for a real model. The bundled 135M demo model's much smaller
sizes live in the demo's configurations (``conf/env/arithmetic.yaml``, ``conf/env/swe-local.yaml``) and
in the tests, which pin what they need.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """An episode's limits. ``max_steps``: the environment's own step limit (a SWE episode's tool
    steps; None where it has none); ``max_turns``: model calls; ``max_tokens``: generated tokens, all
    turns together; ``max_tokens_per_turn``: one turn's answer; ``temperature``: sampling. A token
    limit of None: no limit beyond the context."""

    max_steps: int | None = None
    max_turns: int
    max_tokens: int | None = None
    max_tokens_per_turn: int | None = None
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_turns", "max_tokens", "max_tokens_per_turn"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a whole number >= 1{'' if name == 'max_turns' else ' or None'}, "
                                 f"got {value!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")

    def override(self, **given: Any) -> Budgets:
        """This record with the values in ``given`` that are not None (the flags that were set)."""
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})

    def describe(self) -> str:
        """One line: ``300 steps, 300 turns, no token budget, temperature 1.0``."""
        parts = [] if self.max_steps is None else [f"{self.max_steps} steps"]
        parts.append(f"{self.max_turns} turn{'s' if self.max_turns != 1 else ''}")
        parts.append("no token budget" if self.max_tokens is None else f"{self.max_tokens} tokens")
        if self.max_tokens_per_turn is not None:
            parts.append(f"{self.max_tokens_per_turn} tokens a turn")
        parts.append(f"temperature {self.temperature}")
        return ", ".join(parts)


# SWE-bench (Verified, Lite, full): the SAO paper's 300 steps (METHOD.md), one model call each; no token
# budget and no per-turn cap: a real agent generates 20-50k tokens over 30-100 turns, and the context
# (50-100k of it) is the only other bound.
SWE_BENCH = Budgets(max_steps=300, max_turns=300)

# The six local SWE tasks: the project's own small repositories, each bug a few lines. 50 steps is the
# environment's own limit (SWEBenchEnv's default), ample for them; no token budget beyond the context.
SWE_LOCAL = Budgets(max_steps=50, max_turns=50)

# BeyondAIME and IMO-AnswerBench: the paper's 50 tool turns (with --tools python; without a tool the
# first answer ends the episode) at temperature 1.0, no token budget beyond the context.
MATH = Budgets(max_turns=50, temperature=1.0)

# Generated arithmetic: one question, one answer (the task as registered: no feedback turns, no tool;
# --env-arg feedback_turns=N or --tools python need --max-turns raised). No token budget: a short
# answer ends the turn, and a model that reasons at length is bounded by the context only.
ARITHMETIC = Budgets(max_turns=1)

PLUGIN_DEFAULT_TURNS = 50
"""A plug-in entry without budgets: its ``max_episode_steps`` as turns, else this many."""


def default_budgets(max_episode_steps: int | None) -> Budgets:
    """The budgets of an entry that declares none (a plug-in): its ``max_episode_steps`` (else
    :data:`PLUGIN_DEFAULT_TURNS`) as turns, no step limit of its own, no token budget, temperature 1.0."""
    return Budgets(max_turns=max_episode_steps or PLUGIN_DEFAULT_TURNS)
