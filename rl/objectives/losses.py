"""Policy and value losses: DIS (SAO), PPO clip with clip-higher and dual-clip, off-policy IS weights,
and the warm start's cross-entropy on demonstrations.

Pure functions on torch tensors. Inputs are ``[B, T]`` (a padded batch; any ``[..., T]`` works) with
``action_mask`` 1 at action tokens and 0 at prompt, observation and padding tokens. Log-probs are of
the sampled tokens. Advantages, returns, old/rollout log-probs and IS weights are treated as constants
(detached); gradients flow only through ``logp_new`` and ``values``. Each loss returns
``(loss, metrics)``: a 0-dim tensor and a dict of floats with namespaced keys over this batch's
action tokens.

Micro-batching: every aggregation mode divides by a normalizer. By default it is computed from the
batch passed in, which is right for one full batch. To accumulate gradients over micro-batches
exactly, pass the FULL batch's normalizer to each micro-batch's loss and sum (do not average) the
micro-batch gradients: ``normalizer=`` the global action-token count for ``"token-mean"``, the global
count of sequences that have action tokens for ``"seq-mean-token-mean"``, and the same constant for
``"token-sum-norm"``.
"""

from __future__ import annotations


import torch
from torch import Tensor

from sao.hints import did_you_mean

AGG_MODES = ("token-mean", "seq-mean-token-mean", "token-sum-norm")


def aggregate(
    per_token: Tensor, mask: Tensor, mode: str = "token-mean", *, normalizer: float | Tensor | None = None
) -> Tensor:
    """Reduce a per-token loss to a scalar over the tokens where ``mask`` is 1.

    per_token, mask: [B, T] (or any [..., T]; leading dims are sequences).
    mode:
      ``"token-mean"``: sum over masked tokens / number of masked tokens (or ``normalizer``);
      ``"seq-mean-token-mean"``: each sequence's token mean, summed over sequences that have masked
          tokens, / their number (or ``normalizer``); empty rows (padding) count for nothing;
      ``"token-sum-norm"``: sum over masked tokens / ``normalizer``, a constant such as the maximum
          generation length (Dr.GRPO, Liu et al. 2025); required for this mode.
    Values at unmasked positions are never read (NaN or inf there cannot leak in).
    """
    if mode not in AGG_MODES:
        hint = did_you_mean(mode, AGG_MODES, clause=True)
        raise ValueError(f"unknown aggregation mode {mode!r} (known: {', '.join(AGG_MODES)}){hint}")
    m = mask.bool()
    x = torch.where(m, per_token, 0.0)
    if mode == "token-mean":
        n = m.sum().clamp(min=1) if normalizer is None else normalizer
        return x.sum() / n
    if mode == "seq-mean-token-mean":
        t = x.shape[-1]
        counts = m.reshape(-1, t).sum(-1)
        seq_means = x.reshape(-1, t).sum(-1) / counts.clamp(min=1)
        n = (counts > 0).sum().clamp(min=1) if normalizer is None else normalizer
        return seq_means.sum() / n
    if normalizer is None:
        raise ValueError("mode 'token-sum-norm' needs a constant normalizer (e.g. the maximum generation length)")
    return x.sum() / normalizer


def _masked_means(mask: Tensor, **values: Tensor) -> dict[str, float]:
    """Means over ``mask`` of several same-shaped tensors, fetched to the host in one transfer."""
    m = mask.bool()
    n = m.sum().clamp(min=1)
    stacked = torch.stack([torch.where(m, v.detach().float(), 0.0).sum() / n for v in values.values()])
    return dict(zip(values, stacked.tolist()))


@torch.no_grad()
def dis_mask(logp_new: Tensor, logp_rollout: Tensor, *, eps_low: float = 0.3, eps_high: float = 5.0) -> Tensor:
    """1.0 where ``ratio = exp(logp_new - logp_rollout)`` lies strictly inside ``(1 - eps_low, 1 + eps_high)``,
    0.0 elsewhere (SAO's DIS, METHOD.md 1.8). Same shape and dtype as ``logp_new``; no gradient."""
    ratio = (logp_new - logp_rollout).exp()
    return ((ratio > 1.0 - eps_low) & (ratio < 1.0 + eps_high)).to(logp_new.dtype)


def dis_policy_loss(
    logp_new: Tensor,
    logp_rollout: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    eps_low: float = 0.3,
    eps_high: float = 5.0,
    agg: str = "token-mean",
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Direct double-sided importance sampling loss (SAO, METHOD.md 1.8), all inputs [B, T]:

    ``loss = -sum_t dis_mask_t * ratio_t * A_t / N``, ``ratio_t = exp(logp_new - logp_rollout)`` against
    the engine's logged log-probs. N counts every action token, masked-out ones included (``agg``
    ``"token-mean"``). A token whose ratio leaves the band gets exactly zero gradient, whatever the
    sign of its advantage. Defaults are the paper's math setting; coding uses eps_low 0.8, eps_high 3.0.

    metrics: ``dis/mask_frac`` (share of action tokens masked out), ``dis/mask_low_frac`` (ratio at or
    below 1 - eps_low), ``dis/mask_high_frac`` (at or above 1 + eps_high), ``dis/ratio_mean``.
    """
    act = action_mask.bool()
    keep = dis_mask(logp_new, logp_rollout, eps_low=eps_low, eps_high=eps_high).bool() & act
    # masked tokens: log-ratio 0 before exp, so no inf * 0 = NaN can reach the gradient
    log_ratio = torch.where(keep, logp_new - logp_rollout.detach(), 0.0)
    per_token = torch.where(keep, -log_ratio.exp() * advantages.detach(), 0.0)
    loss = aggregate(per_token, act, agg, normalizer=normalizer)
    with torch.no_grad():
        ratio = (logp_new - logp_rollout).exp()
        metrics = _masked_means(
            act,
            **{"dis/mask_frac": (~keep).float(), "dis/mask_low_frac": (ratio <= 1.0 - eps_low).float(),
               "dis/mask_high_frac": (ratio >= 1.0 + eps_high).float(), "dis/ratio_mean": ratio},
        )
    return loss, metrics


def cross_entropy_loss(
    logp_new: Tensor, action_mask: Tensor, *, agg: str = "token-mean", normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Supervised fine-tuning on demonstrations, [B, T]: ``loss = -sum_t mask_t * logp_new_t / N`` over the
    action tokens only (prompt and tool-output tokens have mask 0 and never count, in the loss or in N).

    metrics: ``sft/nll`` (mean negative log-likelihood per action token) and ``sft/token_prob``
    (mean probability of the demonstrated token)."""
    act = action_mask.bool()
    loss = aggregate(torch.where(act, -logp_new, 0.0), act, agg, normalizer=normalizer)
    with torch.no_grad():
        metrics = _masked_means(act, **{"sft/nll": -logp_new, "sft/token_prob": logp_new.exp()})
    return loss, metrics


def ppo_clip_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip_c: float | None = None,
    is_weights: Tensor | None = None,
    agg: str = "token-mean",
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped surrogate with clip-higher and optional dual-clip, all inputs [B, T].

    per token: ``-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` (Schulman et al. 2017; an
    eps_high above eps_low is DAPO's clip-higher, Yu et al. 2025). With ``dual_clip_c = c > 1`` a
    token with A < 0 has its loss capped at ``-c * A`` (Ye et al. 2020), so a huge ratio cannot
    dominate. ``is_weights`` ([B, T], e.g. :func:`truncated_is_weights` or :func:`masked_is_weights`)
    multiplies the per-token loss. The log-ratio is clamped to [-20, 20] against overflow.

    metrics: ``ppo/clip_frac`` (tokens where the clipped term wins, i.e. zero gradient),
    ``ppo/dual_clip_frac``, ``ppo/ratio_mean``.
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    act = action_mask.bool()
    adv = advantages.detach()
    ratio = torch.where(act, logp_new - logp_old.detach(), 0.0).clamp(-20.0, 20.0).exp()
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    objective = torch.minimum(surr1, surr2)
    dual = torch.zeros_like(act)
    if dual_clip_c is not None:
        dual = (adv < 0) & (objective < dual_clip_c * adv)
        objective = torch.where(dual, dual_clip_c * adv, objective)
    per_token = -objective
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = aggregate(per_token, act, agg, normalizer=normalizer)
    metrics = _masked_means(act, **{"ppo/clip_frac": (surr2 < surr1).float(), "ppo/dual_clip_frac": dual.float(),
                                    "ppo/ratio_mean": ratio})
    return loss, metrics


@torch.no_grad()
def truncated_is_weights(logp_old: Tensor, logp_rollout: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling: ``min(pi_old / pi_rollout, cap)`` per token (METHOD.md 1,
    off-policy corrections; Yao et al. 2025). Same shape as the inputs; detached."""
    return (logp_old - logp_rollout).exp().clamp(max=cap)


@torch.no_grad()
def masked_is_weights(logp_old: Tensor, logp_rollout: Tensor, low: float, high: float) -> Tensor:
    """Masked importance sampling (IcePop): the ratio ``pi_old / pi_rollout`` where it lies in the
    closed interval ``[low, high]``, 0 outside it (METHOD.md 1, off-policy corrections). Detached."""
    ratio = (logp_old - logp_rollout).exp()
    return torch.where((ratio >= low) & (ratio <= high), ratio, 0.0)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    action_mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Value loss at action tokens (METHOD.md 1.9), all inputs [B, T].

    per token: ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2)`` (PPO2's value
    clipping); ``0.5 * (V - R)^2`` when ``clip`` is None. The 0.5 makes the gradient ``V - R``.
    metrics: ``value/clip_frac`` (tokens where the clipped error wins, i.e. zero gradient),
    ``value/mse`` (unclipped squared error), ``value/mean``.
    """
    act = action_mask.bool()
    ret, old = returns.detach(), old_values.detach()
    err = (values - ret) ** 2
    clipped = torch.zeros_like(act)
    if clip is not None:
        err_clipped = (old + (values - old).clamp(-clip, clip) - ret) ** 2
        clipped = err_clipped > err
        err = torch.maximum(err, err_clipped)
    loss = aggregate(0.5 * err, act, agg, normalizer=normalizer)
    metrics = _masked_means(act, **{"value/clip_frac": clipped.float(), "value/mse": (values - ret) ** 2,
                                    "value/mean": values})
    return loss, metrics


@torch.no_grad()
def kl_estimates(logp_new: Tensor, logp_ref: Tensor, mask: Tensor) -> dict[str, float]:
    """Estimates of KL(pi_new || pi_ref) from tokens sampled by pi_new, masked means (Schulman 2020,
    "Approximating KL divergence"), with ``log_r = logp_ref - logp_new``:
    ``kl/k1 = -log_r`` (unbiased, noisy), ``kl/k2 = log_r^2 / 2`` (biased, low variance),
    ``kl/k3 = (e^log_r - 1) - log_r`` (unbiased, >= 0). For metrics only; no gradient."""
    log_r = torch.where(mask.bool(), logp_ref - logp_new, 0.0)
    return _masked_means(mask, **{"kl/k1": -log_r, "kl/k2": 0.5 * log_r**2, "kl/k3": log_r.exp() - 1.0 - log_r})
