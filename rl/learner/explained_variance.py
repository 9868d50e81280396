"""How much of the returns' variance the value model explains: pooled over action tokens, and at each
trajectory's first action token only.

Pooled over every action token, a critic that only tracks position (how many tokens are left, how
long the answer has run) gains explained variance cheaply. At the first action token the value model
has seen the prompt and nothing it sampled, so :func:`first_action_explained_variance` measures
whether it predicts the episode's outcome from the task itself.

Both are undefined (NaN) when the targets have no variance, e.g. a batch whose rewards are all 0:
the ratio then means nothing, and the metric sinks write NaN as ``null`` and trackers drop it, so
such a step is never logged as a number (:mod:`sao.rl.training.critic_summary` averages the steps
where it is defined).
"""

from __future__ import annotations

from torch import Tensor

_CONSTANT = 1e-8  # a target variance below this counts as none


def explained_variance(predicted: Tensor, target: Tensor) -> float:
    """``1 - Var(target - predicted) / Var(target)``: 1 is perfect, 0 is no better than the mean,
    negative is worse. NaN when there are fewer than 2 targets or they have no variance."""
    if target.numel() < 2:
        return float("nan")
    var = target.float().var()
    if float(var) < _CONSTANT:  # (near-)constant targets, e.g. every reward 0: the ratio means nothing
        return float("nan")
    return float(1.0 - (target.float() - predicted.float()).var() / var)


def first_action_tokens(action_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(rows, columns) of each row's first action token, for the rows that have one: two [n] long
    tensors that index a [B, T] tensor."""
    act = action_mask.bool()
    rows = act.any(-1).nonzero().squeeze(-1)
    return rows, act[rows].int().argmax(-1)


def first_action_explained_variance(values: Tensor, returns: Tensor, action_mask: Tensor) -> float:
    """:func:`explained_variance` of ``values`` against ``returns`` ([B, T], token-aligned) taken at each
    row's first action token only: one pair per trajectory (rows without an action token are left out).
    With lambda_critic = 1 and gamma = 1 the return there is the trajectory's reward (plus the bootstrap
    of a truncated row), so this is how well ``V(prompt)`` predicts the outcome."""
    rows, cols = first_action_tokens(action_mask)
    return explained_variance(values[rows, cols], returns[rows, cols])
