"""Advantages and baselines, checked against numbers derived by hand in the comments."""

from __future__ import annotations

import pytest
import torch

from sao.rl.objectives.advantages import RunningMeanBaseline, adaptive_lambda, gae_action_tokens, grpo_advantages, token_rewards

X = 9.0  # a value at an observation token: GAE must never read it


def t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def close(a, b, atol=1e-5):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=atol)


# ---- token_rewards -------------------------------------------------------------------------------

def test_token_rewards_at_last_action_token():
    # last action token of [0,1,1,0,1,0] is index 4
    assert close(token_rewards(t(0, 1, 1, 0, 1, 0), 2.0), [0, 0, 0, 0, 2.0, 0])
    # batch, one reward per row; a row without action tokens has nowhere to put its reward -> all 0
    mask = t(1, 1, 0, 0, 1, 0, 0, 0, 0).reshape(3, 3)
    assert close(token_rewards(mask, t(1.0, -1.0, 5.0)), [[0, 1.0, 0], [0, -1.0, 0], [0, 0, 0]])


# ---- adaptive_lambda -----------------------------------------------------------------------------

def test_adaptive_lambda_by_hand():
    assert adaptive_lambda(2) == pytest.approx(1 - 1 / 3)  # 1 - 1/(1.5*2) = 0.667
    assert adaptive_lambda(100) == pytest.approx(1 - 1 / 150)  # 0.9933: long trajectories -> ~ Monte Carlo
    assert adaptive_lambda(4, alpha=0.5) == pytest.approx(0.5)  # 1 - 1/(0.5*4)
    assert adaptive_lambda(0) == pytest.approx(1 / 3)  # l = 0 guarded as l = 1: 1 - 1/1.5, finite
    lam = adaptive_lambda(torch.tensor([2, 100, 0]))
    assert close(lam, [2 / 3, 149 / 150, 1 / 3]) and torch.isfinite(lam).all()


# ---- gae_action_tokens ---------------------------------------------------------------------------

def test_one_turn_gamma1_lam1_is_reward_minus_value():
    # prompt tokens 0,1; actions 2,3,4; R = 1 at token 4 -> with gamma = lam = 1, A_t = R - V_t
    mask = t(0, 0, 1, 1, 1)
    values = t(X, X, 0.2, 0.5, 0.4)
    adv, ret = gae_action_tokens(token_rewards(mask, 1.0), values, mask, gamma=1.0, lam=1.0)
    assert close(adv, [0, 0, 0.8, 0.5, 0.6])
    assert close(ret, [0, 0, 1, 1, 1])


def test_lambda_below_one_by_hand():
    # V = [0.4, 0.2, 0.6], R = 1 at the last token, gamma 1, lam 0.5
    # t=2: delta = 1 + 0 - 0.6 = 0.4;         A2 = 0.4
    # t=1: delta = 0 + 0.6 - 0.2 = 0.4;       A1 = 0.4 + 0.5*0.4  = 0.6
    # t=0: delta = 0 + 0.2 - 0.4 = -0.2;      A0 = -0.2 + 0.5*0.6 = 0.1
    # returns = A + V = [0.5, 0.8, 1.0]
    mask = t(1, 1, 1)
    adv, ret = gae_action_tokens(t(0, 0, 1), t(0.4, 0.2, 0.6), mask, lam=0.5)
    assert close(adv, [0.1, 0.6, 0.4])
    assert close(ret, [0.5, 0.8, 1.0])


def test_two_turns_jump_over_the_observation_gap():
    # mask [0,0,1,1,0,0,1]: turn 1 = tokens 2,3; tool output = 4,5; turn 2 = token 6. gamma 1, lam 0.5
    # t=6: delta = 1 + 0 - 0.5 = 0.5;                    A6 = 0.5
    # t=3: next action is 6 (not 4): delta = 0 + V6 - V3 = 0.5 - 0.4 = 0.1;  A3 = 0.1 + 0.5*0.5 = 0.35
    # t=2: delta = 0 + V3 - V2 = 0.4 - 0.2 = 0.2;        A2 = 0.2 + 0.5*0.35 = 0.375
    # returns = A + V: [0.575, 0.75, 1.0]; observation positions 0 (reading V=9 there would show)
    mask = t(0, 0, 1, 1, 0, 0, 1)
    values = t(X, X, 0.2, 0.4, X, X, 0.5)
    adv, ret = gae_action_tokens(token_rewards(mask, 1.0), values, mask, lam=0.5)
    assert close(adv, [0, 0, 0.375, 0.35, 0, 0, 0.5])
    assert close(ret, [0, 0, 0.575, 0.75, 0, 0, 1.0])


def test_gamma_discounts_once_per_action_step_not_per_skipped_token():
    # mask [1,0,0,1], V = [0.2, X, X, 0.6], R = 1, gamma 0.5, lam 1
    # t=3: delta = 1 - 0.6 = 0.4; A3 = 0.4
    # t=0: delta = 0 + 0.5*0.6 - 0.2 = 0.1; A0 = 0.1 + 0.5*1*0.4 = 0.3  (= gamma^1 * R - V0 = 0.5 - 0.2;
    #      a per-token discount over the gap would give 0.5^3 - 0.2 = -0.075)
    mask = t(1, 0, 0, 1)
    adv, _ = gae_action_tokens(t(0, 0, 0, 1), t(0.2, X, X, 0.6), mask, gamma=0.5, lam=1.0)
    assert close(adv, [0.3, 0, 0, 0.4])


def test_bootstrap_on_truncation():
    # truncated after 2 action tokens, no reward; V = [0.3, 0.6]; value of the next state 0.8; gamma = lam = 1
    # t=1: delta = 0 + 0.8 - 0.6 = 0.2; A1 = 0.2
    # t=0: delta = 0 + 0.6 - 0.3 = 0.3; A0 = 0.3 + 0.2 = 0.5; returns = [0.8, 0.8]
    mask, values, r = t(1, 1), t(0.3, 0.6), t(0, 0)
    adv, ret = gae_action_tokens(r, values, mask, lam=1.0, bootstrap=0.8)
    assert close(adv, [0.5, 0.2]) and close(ret, [0.8, 0.8])
    # terminated (no bootstrap): A1 = 0 - 0.6, A0 = 0.6 - 0.3 - 0.6 = -0.3; returns 0
    adv, ret = gae_action_tokens(r, values, mask, lam=1.0)
    assert close(adv, [-0.3, -0.6]) and close(ret, [0, 0])


def test_batch_with_per_row_lambda_and_padding():
    # row 0: the lam = 0.5 example above -> A = [0.1, 0.6, 0.4]
    # row 1: two action tokens then padding, R = 0, lam = 1: A1 = 0 - 0.7 = -0.7; A0 = 0.7 - 0.4 - 0.7 = -0.4
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    values = torch.tensor([[0.4, 0.2, 0.6], [0.4, 0.7, X]])
    rewards = token_rewards(mask, torch.tensor([1.0, 0.0]))
    adv, ret = gae_action_tokens(rewards, values, mask, lam=torch.tensor([0.5, 1.0]))
    assert close(adv, [[0.1, 0.6, 0.4], [-0.4, -0.7, 0]])
    assert close(ret, [[0.5, 0.8, 1.0], [0.0, 0.0, 0]])
    # per-row bootstrap: only row 1 is truncated (next-state value 0.3): A1 = 0.3 - 0.7 = -0.4, A0 = 0.3 - 0.4 = -0.1
    adv, _ = gae_action_tokens(rewards, values, mask, lam=torch.tensor([0.5, 1.0]), bootstrap=torch.tensor([0.0, 0.3]))
    assert close(adv, [[0.1, 0.6, 0.4], [-0.1, -0.4, 0]])


def test_lambda_one_returns_are_monte_carlo():
    # gamma = lam = 1: A_t telescopes to R - V_t, so every action token's return is R, whatever V is
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(4, 12, generator=g) < 0.6).int()
    mask[:, 0] = 1
    values = torch.randn(4, 12, generator=g)
    reward = torch.tensor([1.0, 0.0, -2.0, 0.5])
    adv, ret = gae_action_tokens(token_rewards(mask, reward), values, mask, lam=1.0)
    expected = reward[:, None].expand(4, 12) * mask
    assert torch.allclose(ret, expected, atol=1e-5)
    assert torch.allclose(adv, (reward[:, None] - values) * mask, atol=1e-5)


def test_gae_returns_are_detached():
    values = t(0.1, 0.2).requires_grad_()
    adv, ret = gae_action_tokens(t(0, 1), values, t(1, 1), lam=0.9)
    assert not adv.requires_grad and not ret.requires_grad


# ---- grpo_advantages -----------------------------------------------------------------------------

def test_grpo_and_dr_grpo_by_hand():
    r = t(1, 0, 0, 1)
    # mean 0.5; deviations +-0.5; unbiased var = 4*0.25/3 = 1/3 -> std 0.57735 -> A = +-0.5/0.57735 = +-0.86603
    assert close(grpo_advantages(r), [0.86603, -0.86603, -0.86603, 0.86603])
    # population std 0.5 -> A = +-0.5/0.5 = +-1
    assert close(grpo_advantages(r, unbiased=False), [1.0, -1.0, -1.0, 1.0])
    # Dr.GRPO: no std -> A = R - mean = +-0.5
    assert close(grpo_advantages(r, scale_by_std=False), [0.5, -0.5, -0.5, 0.5])


def test_grpo_several_groups_by_id():
    # group 7 = [1,0,0,1] -> +-0.86603 (above); group 2 = [3,5]: mean 4, unbiased std sqrt(2/1) = 1.41421
    # -> A = -1/1.41421 = -0.70711, +0.70711. The groups interleave in the flat batch.
    r = t(1, 0, 3, 0, 1, 5)
    ids = torch.tensor([7, 7, 2, 7, 7, 2])
    assert close(grpo_advantages(r, ids), [0.86603, -0.86603, -0.70711, -0.86603, 0.86603, 0.70711])
    assert close(grpo_advantages(r, ids, scale_by_std=False), [0.5, -0.5, -1.0, -0.5, 0.5, 1.0])


def test_grpo_equal_rewards_give_zero_not_nan():
    # row 0: [1,0,0,1] as above; row 1 all equal (0.3 * 4 is not exact in float32); a group of one
    adv = grpo_advantages(torch.tensor([[1, 0, 0, 1], [0.3, 0.3, 0.3, 0.3]]))
    assert close(adv[0], [0.86603, -0.86603, -0.86603, 0.86603])
    assert torch.equal(adv[1], torch.zeros(4))
    assert torch.equal(grpo_advantages(t(0.7, 2.0), torch.tensor([0, 1])), torch.zeros(2))


# ---- RunningMeanBaseline -------------------------------------------------------------------------

def test_running_mean_baseline_window_by_hand():
    b = RunningMeanBaseline(window=3)
    # reward 1: no history -> baseline 0 -> A = 1;         history [1]
    # reward 0: baseline 1 -> A = -1;                      history [1, 0]
    # reward 1: baseline 1/2 -> A = 0.5;                   history [1, 0, 1]
    # reward 1: baseline 2/3 -> A = 1/3;                   history [0, 1, 1] (window 3: the first 1 leaves)
    # reward 0: baseline 2/3 -> A = -2/3;                  history [1, 1, 0]
    got = [b.advantage(r, key="math") for r in (1, 0, 1, 1, 0)]
    assert got == pytest.approx([1, -1, 0.5, 1 / 3, -2 / 3])
    assert b.baseline("math") == pytest.approx(2 / 3)
    # other keys and the global history (key None) are separate
    assert b.advantage(0.5, key="swe") == 0.5 and b.baseline() == 0.0
    state = b.state_dict()
    restored = RunningMeanBaseline()
    restored.load_state_dict(state)
    assert restored.window == 3 and restored.baseline("math") == pytest.approx(2 / 3)


def test_running_mean_default_window_is_8():
    b = RunningMeanBaseline()
    for r in range(10):  # 0..9: the last 8 are 2..9, mean 5.5
        b.update(r)
    assert b.baseline() == 5.5
    assert b.advantage(10.0) == 4.5 and b.baseline() == pytest.approx(sum(range(3, 11)) / 8)
    with pytest.raises(ValueError):
        RunningMeanBaseline(window=0)

