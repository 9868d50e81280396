"""Advantages and baselines: token-level GAE over action tokens, GRPO group baselines, running mean.

Pure functions on torch tensors (the one stateful piece is :class:`RunningMeanBaseline`). Shapes use
``B`` for trajectories in a batch and ``T`` for (padded) tokens; ``action_mask`` is 1 where the policy
sampled the token and 0 at prompt, observation and padding tokens, as in ``Trajectory.action_mask``.
Advantages are learning targets: every function here returns detached tensors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

import torch
from torch import Tensor


def token_rewards(action_mask: Tensor, reward: float | Tensor) -> Tensor:
    """Per-token rewards: ``reward`` at each row's last action token, 0 elsewhere (METHOD.md 1.6).

    action_mask: [T] or [B, T]. reward: a float, or a [B] tensor (one per row).
    Returns a float tensor shaped like ``action_mask``. A row without action tokens gets all zeros:
    there is no token to hold its reward, and no token would be trained on anyway.
    """
    mask = action_mask.bool()
    rows = mask.reshape(-1, mask.shape[-1])
    reward = torch.as_tensor(reward, dtype=torch.float32, device=mask.device).reshape(-1).expand(rows.shape[0])
    t = rows.shape[-1]
    # the last True of a row is the first True of the flipped row
    last = t - 1 - rows.flip(-1).int().argmax(-1)
    out = torch.zeros(rows.shape, dtype=torch.float32, device=mask.device)
    out[torch.arange(rows.shape[0], device=mask.device), last] = reward
    out = out * rows  # rows without action tokens: argmax points at a non-action token; zero it
    return out.reshape(mask.shape)


def adaptive_lambda(num_action_tokens: int | float | Tensor, alpha: float = 1.5) -> float | Tensor:
    """Length-adaptive GAE lambda, ``1 - 1 / (alpha * l)`` (SAO, METHOD.md 1.7; VAPO's form).

    num_action_tokens: ``l``, an int/float or a tensor of any shape (e.g. [B] = ``action_mask.sum(-1)``).
    Returns a float, or a float tensor of the same shape. ``l = 0`` (no action token, so lambda is
    never used) is treated as ``l = 1`` to stay finite; the result is clamped to [0, 1] so that an
    ``alpha < 1`` cannot make it negative.
    """
    if isinstance(num_action_tokens, Tensor):
        length = num_action_tokens.float().clamp(min=1.0)
        return (1.0 - 1.0 / (alpha * length)).clamp(0.0, 1.0)
    length = max(float(num_action_tokens), 1.0)
    return min(max(1.0 - 1.0 / (alpha * length), 0.0), 1.0)


@torch.no_grad()
def gae_action_tokens(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float | Tensor,
    bootstrap: float | Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over action tokens only (SAO, METHOD.md 1.6).

    rewards, values, action_mask: [B, T] (a padded batch) or [T] (one trajectory).
    lam: a float, or a [B] tensor (one lambda per row, e.g. ``adaptive_lambda(action_mask.sum(-1))``).
    bootstrap: the value after each row's last action token: None or 0 when the episode terminated;
        for a truncated episode, an estimate of the next state's value (a float or a [B] tensor, e.g.
        the value model's output at the row's final token). The learner bootstraps on truncation only.
    Returns (advantages, returns), float tensors shaped like ``values``, 0 at non-action tokens;
    ``returns = advantages + values`` at action tokens.

    Observation tokens are skipped, not stepped through: for consecutive action tokens t < t'
    (possibly in different turns) ``delta_t = r_t + gamma * V(t') - V(t)`` and
    ``A_t = delta_t + gamma * lam * A_t'``, so gamma discounts once per action token, never per skipped
    observation token. Rewards and values at non-action tokens are ignored (Schulman et al. 2016, eq. 16,
    with the time index running over action tokens).
    """
    one_row = values.dim() == 1
    if one_row:
        rewards, values, action_mask = rewards[None], values[None], action_mask[None]
    rewards, values = rewards.float(), values.detach().float()
    mask = action_mask.bool()
    b, t_len = values.shape
    lam_t = torch.as_tensor(lam, dtype=torch.float32, device=values.device).reshape(-1).expand(b)
    next_value = torch.zeros(b, device=values.device)
    if bootstrap is not None:
        next_value = next_value + torch.as_tensor(bootstrap, dtype=torch.float32, device=values.device).reshape(-1)
    next_adv = torch.zeros(b, device=values.device)
    adv = torch.zeros_like(values)
    for t in reversed(range(t_len)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam_t * next_adv
        adv[:, t] = torch.where(m, a, 0.0)
        # carry V(t') and A_t' across observation tokens unchanged
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, a, next_adv)
    returns = torch.where(mask, adv + values, 0.0)
    if one_row:
        return adv[0], returns[0]
    return adv, returns


@torch.no_grad()
def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    eps: float = 1e-6,
    scale_by_std: bool = True,
    unbiased: bool = True,
) -> Tensor:
    """Group-relative advantages: ``(R - mean_group) / (std_group + eps)`` (GRPO, Shao et al. 2024).

    rewards: [N] with ``group_ids`` [N] (any integer labels, groups may interleave), or [G] (one group),
        or [num_groups, G] (one group per row) when ``group_ids`` is None.
    scale_by_std: False gives Dr.GRPO (Liu et al. 2025): ``R - mean_group``, no division.
    unbiased: the std with Bessel's correction (n - 1), as torch.std, TRL and verl compute it;
        False for the population std (n).
    Returns a float tensor shaped like ``rewards``. A group whose rewards are all equal (including a
    group of one) gets exactly 0, never NaN.
    """
    r = rewards.float()
    flat = r.reshape(-1)
    if group_ids is not None:
        inverse = torch.unique(group_ids.reshape(-1), return_inverse=True)[1]
    elif r.dim() == 2:  # one group per row
        inverse = torch.arange(r.numel(), device=r.device) // r.shape[-1]
    else:  # one group
        inverse = torch.zeros(r.numel(), dtype=torch.long, device=r.device)
    n_groups = int(inverse.max()) + 1 if flat.numel() else 0
    count = torch.zeros(n_groups, device=r.device).index_add_(0, inverse, torch.ones_like(flat))
    mean = torch.zeros(n_groups, device=r.device).index_add_(0, inverse, flat) / count
    hi = torch.full((n_groups,), -torch.inf, device=r.device).scatter_reduce(0, inverse, flat, "amax")
    lo = torch.full((n_groups,), torch.inf, device=r.device).scatter_reduce(0, inverse, flat, "amin")
    # equal rewards: exactly 0 (a float mean of equal values can miss them by an ulp, and / eps would blow it up)
    dev = torch.where((hi == lo)[inverse], 0.0, flat - mean[inverse])
    if scale_by_std:
        sq = torch.zeros(n_groups, device=r.device).index_add_(0, inverse, dev**2)
        dof = (count - 1).clamp(min=1) if unbiased else count
        dev = dev / ((sq / dof).sqrt()[inverse] + eps)
    return dev.reshape(r.shape)


class RunningMeanBaseline:
    """A single-rollout baseline: the mean of the last ``window`` rewards (METHOD.md 1.11, window 8).

    Keeps one history per key (a task family, a prompt id, ...); ``key=None`` is the global history.
    :meth:`advantage` returns ``reward - baseline`` with the baseline taken BEFORE the new reward is
    added, so a reward never baselines itself; then it records the reward. A key with no history yet
    has baseline ``initial`` (default 0.0, so the first advantage is the reward itself).
    Rewards of one batch are processed in the order given.
    """

    def __init__(self, window: int = 8, initial: float = 0.0) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.initial = initial
        self._history: dict[Hashable, deque[float]] = {}

    def baseline(self, key: Hashable = None) -> float:
        """The current mean for ``key`` (``initial`` when it has no history); changes nothing."""
        history = self._history.get(key)
        return sum(history) / len(history) if history else self.initial

    def update(self, reward: float, key: Hashable = None) -> None:
        """Record ``reward`` for ``key``; the oldest one leaves once ``window`` are held."""
        self._history.setdefault(key, deque(maxlen=self.window)).append(float(reward))

    def advantage(self, reward: float, key: Hashable = None) -> float:
        """``reward - baseline(key)``, then ``update(reward, key)``."""
        adv = float(reward) - self.baseline(key)
        self.update(reward, key)
        return adv

    def state_dict(self) -> dict:
        """Plain data for a checkpoint (the histories, oldest first)."""
        return {"window": self.window, "initial": self.initial,
                "history": [(k, list(v)) for k, v in self._history.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.window, self.initial = state["window"], state["initial"]
        self._history = {k: deque(v, maxlen=self.window) for k, v in state["history"]}
