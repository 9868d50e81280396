"""The value head fitted in closed form (sao.rl.learner.ridge_head): the statistics give the ridge regression
of the standardised features, the decay weighs older batches, and SAO with ``value_head_ridge`` baselines
each batch with the head fitted on the batches before it, never moving the trunk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sao.rl.algos import SAO, SAOConfig
from sao.rl.learner.batch import collate
from sao.rl.learner.learner import Learner, LearnerConfig
from sao.rl.learner.ridge_head import SD_FLOOR, RidgeHead
from sao.rl.learner.value_model import ValueModel

from tests.test_learner import random_trajs
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def direct_ridge(x: np.ndarray, y: np.ndarray, ridge: float, weights: np.ndarray | None = None) -> np.ndarray:
    """Predictions of a weighted ridge regression on standardised, centred features, written out."""
    w8 = np.ones(len(y)) if weights is None else weights
    n = w8.sum()
    mu = (w8[:, None] * x).sum(0) / n
    sd = np.sqrt((w8[:, None] * (x - mu) ** 2).sum(0) / n)
    sd = np.maximum(sd, SD_FLOOR * np.sort(sd)[(len(sd) - 1) // 2] + 1e-6)  # torch's median: the lower middle
    a = (x - mu) / sd
    ym = (w8 * y).sum() / n
    coef = np.linalg.solve(a.T @ (w8[:, None] * a) + ridge * np.eye(x.shape[1]), a.T @ (w8 * (y - ym)))
    return a @ coef + ym


def test_the_statistics_solve_the_ridge_regression_of_the_standardised_features():
    g = np.random.default_rng(0)
    x = g.normal(size=(300, 5)) * np.array([1.0, 10.0, 0.1, 3.0, 1.0]) + 4.0
    y = x @ np.array([0.3, -0.02, 2.0, 0.0, 0.1]) + g.normal(scale=0.5, size=300)
    for ridge in (1.0, 100.0):
        head = RidgeHead(5, ridge)
        head.add(torch.from_numpy(x[:120]), torch.from_numpy(y[:120]))
        head.add(torch.from_numpy(x[120:]), torch.from_numpy(y[120:]))
        w, b = head.solve()
        np.testing.assert_allclose(x @ w.numpy() + b.item(), direct_ridge(x, y, ridge), atol=1e-6)


def test_decay_weighs_each_older_batch_once_more():
    g = np.random.default_rng(1)
    x1, x2 = g.normal(size=(50, 3)), g.normal(size=(40, 3)) + 1.0
    y1, y2 = x1[:, 0] + 1.0, -x2[:, 1]
    head = RidgeHead(3, 10.0, decay=0.25)
    for x, y in ((x1, y1), (x2, y2)):
        head.decay_once()
        head.add(torch.from_numpy(x), torch.from_numpy(y))
    w, b = head.solve()
    x, y = np.concatenate([x1, x2]), np.concatenate([y1, y2])
    weights = np.concatenate([np.full(50, 0.25), np.ones(40)])
    np.testing.assert_allclose(x @ w.numpy() + b.item(), direct_ridge(x, y, 10.0 / 1.0, weights), atol=1e-6)


def test_a_feature_nearly_constant_so_far_does_not_blow_up_a_later_value():
    """Feature 2 barely moved in the fit data; a value where it moves by 1 stays within the floor's reach:
    standardised at the floor (a tenth of the others' spread) its signal is too small to outweigh the penalty."""
    g = np.random.default_rng(2)
    x = g.normal(size=(200, 3))
    x[:, 2] = 1e-4 * g.normal(size=200)
    y = x[:, 0] + x[:, 2] / 1e-4  # half the target's variance rides on the near-constant feature
    head = RidgeHead(3, 1.0)
    head.add(torch.from_numpy(x), torch.from_numpy(y))
    w, _ = head.solve()
    assert abs(w[2].item()) < 20, w  # unfloored it is about 1 / 1e-4: a move of 1 would add 1e4 to a value


def test_values_are_clipped_to_the_range_of_the_targets_seen():
    head = RidgeHead(2, 1.0)
    wide = torch.tensor([-5.0, 0.3, 9.0])
    assert torch.equal(head.bound(wide), wide)  # nothing seen yet: no bound
    head.add(torch.zeros(3, 2, dtype=torch.float64), torch.tensor([0.0, 1.0, 0.5], dtype=torch.float64))
    head.decay_once()  # the range is not decayed
    assert head.bound(wide).tolist() == pytest.approx([0.0, 0.3, 1.0])
    policy = tiny_llama()
    value = ValueModel.from_policy(policy)
    value.fit_head_in_closed_form(1.0)
    value.head_fit.add(torch.zeros(2, value.head.in_features), torch.tensor([0.2, 0.4]))
    with torch.no_grad():
        value.head.bias.fill_(3.0)  # a head far outside what it was fitted on
    ids = torch.tensor([[1, 2, 3]])
    assert torch.allclose(value(ids, torch.ones_like(ids)), torch.tensor(0.4))
    assert {"head_fit.y_min", "head_fit.y_max"} <= set(value.state_dict())


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="ridge > 0"):
        RidgeHead(3, 0.0)
    with pytest.raises(ValueError, match="decay"):
        RidgeHead(3, 1.0, decay=1.5)


def test_sao_with_a_closed_form_head_baselines_each_batch_with_the_batches_before_it():
    """The first batch's values come from the untouched head (near 0); after it the head predicts the
    returns of a batch like it; the trunk never moves and the statistics travel in the value model's
    state dict (the checkpoint)."""
    torch.manual_seed(0)
    policy = tiny_llama()
    value = ValueModel.from_policy(policy)
    learner = Learner(policy, LearnerConfig(value_head_ridge=1.0), value_model=value)
    trunk_before = {n: p.detach().clone() for n, p in value.backbone.named_parameters()}
    assert not any(p.requires_grad for p in value.parameters())
    algo = SAO(SAOConfig(value_head_ridge=1.0))
    trajs = random_trajs([9, 8, 7, 9, 6, 8])
    for i, t in enumerate(trajs):
        object.__setattr__(t, "reward", float(i % 2))
    batch = collate(trajs, pad_id=0)
    first = algo.pretrain_critic(learner, batch)
    assert first["value/fit_examples"] == float(batch.action_mask.sum())
    assert first["value/mse"] == pytest.approx(float(torch.tensor([t.reward for t in trajs]).pow(2).mean()), abs=0.05)
    second = algo.pretrain_critic(learner, batch)  # the same episodes again: the fitted head knows them
    assert second["value/explained_var"] > 0.5 and second["value/mse"] < first["value/mse"]
    assert all(torch.equal(p, trunk_before[n]) for n, p in value.backbone.named_parameters())
    state = value.state_dict()
    assert state["head_fit.count"].item() == 2 * float(batch.action_mask.sum())
    metrics = algo.update(learner, batch)  # a policy step with this critic: no value optimizer step
    assert "lr/value" not in metrics and "value/fit_examples" in metrics


def test_a_closed_form_head_refuses_data_parallel_ranks():
    policy = tiny_llama()
    with pytest.raises(ValueError, match="one learner rank"):
        Learner(policy, LearnerConfig(value_head_ridge=1.0), value_model=ValueModel.from_policy(policy),
                data_parallel=object())  # type: ignore[arg-type]
