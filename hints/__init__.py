"""Hints in error messages: the known name closest to a misspelled one ("did you mean").

A leaf below every other package (standard library only, nothing of ``sao``), so that each may import it
under the import direction, the light ones too (the rollout schedulers and the routers, which load no torch
and nothing of ``envs``; ``sao-model``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str], *, cutoff: float = 0.6, clause: bool = False) -> str:
    """What a message about the unknown ``name`` says of the closest of ``known`` (difflib's ratio at least
    ``cutoff``): `` Did you mean 'x'?``, a sentence of its own, or with ``clause`` ``; did you mean 'x'?``,
    the end of the message's sentence; "" when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    if not close:
        return ""
    return f"; did you mean {close[0]!r}?" if clause else f" Did you mean {close[0]!r}?"
