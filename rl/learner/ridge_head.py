"""The value model's head fitted in closed form: a ridge regression of the critic's targets on the frozen
trunk's features at action tokens, over every batch so far (``docs/results/critic.md``).

At the 135M scale the value model trained by gradient stays a constant for its first dozens of batches
(held-out explained variance near 0), while a ridge regression on the same trunk's features explains a
quarter of the reward's variance from 70 episodes. :class:`RidgeHead` keeps the regression's sufficient
statistics (float64 sums of the features, their outer products, the targets and their products with the
features) as buffers of the value model, so a checkpoint carries them with its weights; each batch adds
its action tokens (after multiplying what was there by ``decay``: 1 keeps every batch at full weight, less
forgets the older policies' episodes) and the head is solved again. Features are standardised with the
statistics' own mean and spread before the penalty applies, so ``ridge`` means the same whatever the
hidden states' scale. The trunk takes no step: the critic costs one forward pass a batch.

Two bounds keep the linear head from extrapolating when the policy moves its episodes away from those it
was fitted on: a feature's spread is floored at a tenth of the median feature's before it is standardised
(a feature nearly constant so far would otherwise get a weight of its own scale's inverse, and any later
movement of it a value far outside the targets), and the head's predictions are clipped to the range of the
targets seen so far (:meth:`RidgeHead.bound`, applied by the value model to every value).

:func:`head_fit_step` is the :class:`~sao.rl.learner.learner.Learner` block that uses it, with
:meth:`~sao.rl.learner.learner.Learner.first_value_step`'s contract: the values before the fit come back
(so the critic never sees the outcome it baselines), the targets are the algorithm's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from sao.rl.learner.batch import Batch, micro_batches

if TYPE_CHECKING:
    from sao.rl.learner.learner import CriticTargets, Learner


SD_FLOOR = 0.1  # a feature's spread, for standardising, is at least this fraction of the median feature's


class RidgeHead(nn.Module):
    """Ridge regression statistics for a linear head on ``hidden_size`` features (buffers, float64)."""

    def __init__(self, hidden_size: int, ridge: float, decay: float = 1.0) -> None:
        super().__init__()
        if not ridge > 0 or not 0 < decay <= 1:
            raise ValueError(f"a ridge head needs ridge > 0 and 0 < decay <= 1, got ridge={ridge}, decay={decay}")
        self.ridge, self.decay = ridge, decay
        f64 = torch.float64
        self.register_buffer("count", torch.zeros((), dtype=f64))
        self.register_buffer("sum_x", torch.zeros(hidden_size, dtype=f64))
        self.register_buffer("sum_xx", torch.zeros(hidden_size, hidden_size, dtype=f64))
        self.register_buffer("sum_y", torch.zeros((), dtype=f64))
        self.register_buffer("sum_xy", torch.zeros(hidden_size, dtype=f64))
        self.register_buffer("y_min", torch.tensor(float("inf"), dtype=f64))  # the targets' range so far
        self.register_buffer("y_max", torch.tensor(float("-inf"), dtype=f64))

    @torch.no_grad()
    def decay_once(self) -> None:
        """Weigh everything seen so far by ``decay`` (once per batch, before its examples are added)."""
        for buf in (self.count, self.sum_x, self.sum_xx, self.sum_y, self.sum_xy):
            buf.mul_(self.decay)

    @torch.no_grad()
    def add(self, x: Tensor, y: Tensor) -> None:
        """Examples: features ``x`` [N, H] and targets ``y`` [N]."""
        x, y = x.to(self.sum_x), y.to(self.sum_x)
        self.count += x.shape[0]
        self.sum_x += x.sum(0)
        self.sum_xx += x.T @ x
        self.sum_y += y.sum()
        self.sum_xy += x.T @ y
        if y.numel():
            self.y_min.clamp_(max=float(y.min()))
            self.y_max.clamp_(min=float(y.max()))

    def bound(self, values: Tensor) -> Tensor:
        """``values`` clipped to the range of the targets seen so far (unchanged before any)."""
        if not bool(torch.isfinite(self.y_min)):
            return values
        return values.clamp(float(self.y_min), float(self.y_max))

    @torch.no_grad()
    def solve(self) -> tuple[Tensor, Tensor]:
        """(weight [H], bias []) of the ridge fit on the standardised features, in the raw features' units.
        Before any example: zeros."""
        n = float(self.count)
        if n <= 0:
            return torch.zeros_like(self.sum_x), torch.zeros_like(self.sum_y)
        mean_x, mean_y = self.sum_x / n, self.sum_y / n
        cov = self.sum_xx / n - torch.outer(mean_x, mean_x)
        cross = self.sum_xy / n - mean_x * mean_y
        sd = cov.diagonal().clamp(min=0).sqrt()
        sd = sd.clamp(min=float(SD_FLOOR * sd.median()) + 1e-6)  # a near-constant feature is not blown up
        # (A^T A + ridge I) w = A^T y on the standardised, centred examples A = (X - mean) / sd, divided by n
        a = cov / torch.outer(sd, sd) + (self.ridge / n) * torch.eye(len(sd), dtype=cov.dtype, device=cov.device)
        w = torch.linalg.solve(a, cross / sd) / sd
        return w, mean_y - w @ mean_x


def head_fit_step(learner: Learner, batch: Batch, targets: CriticTargets) -> tuple[dict[str, float], tuple[Tensor, Tensor]]:
    """One closed-form critic update on ``batch``: the values before it (one no-gradient pass of the value
    model per micro-batch), the targets from ``targets`` as in ``first_value_step``, their action tokens
    added to the statistics, and the head set to the new solution. Returns metrics and the values."""
    from sao.rl.learner.learner import _autocast, _pad_to  # here: learner imports this module

    vm, cfg = learner._value(), learner.config
    fit: RidgeHead = vm.head_fit
    batch = batch.to(learner.device)
    fit.decay_once()
    seen_values, seen_last, sq_err, n_act = [], [], 0.0, 0
    with torch.no_grad():
        for mb in micro_batches(learner.share.local(batch), cfg.token_budget, packed=cfg.pack):
            with _autocast(learner.device, cfg.critic_autocast):
                feats, last_feats = vm.token_features(mb.input_ids, mb.attention_mask, cfg.pack)
            feats, last_feats = feats.float(), last_feats.float()
            values, last = vm.head_values(feats), vm.head_values(last_feats)
            values[:, 0] = 0.0  # as ValueModel.token_values: token 0 is never an action
            mb = targets(mb, values, last)
            act = mb.action_mask.bool()
            fit.add(feats[act], mb.returns[act])
            sq_err += float(((values[act] - mb.returns[act]) ** 2).sum())
            n_act += int(act.sum())
            seen_values.append(_pad_to(values, batch.input_ids.shape[1]))
            seen_last.append(last)
    weight, bias = fit.solve()
    with torch.no_grad():
        vm.head.weight.copy_(weight.to(vm.head.weight)[None])
        vm.head.bias.copy_(bias.to(vm.head.bias).reshape(1))
    metrics = {"value/mse": sq_err / max(n_act, 1), "value/fit_examples": float(fit.count)}
    return metrics, learner.share.gather(seen_values, seen_last, batch)
