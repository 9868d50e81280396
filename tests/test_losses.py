"""Losses, checked against numbers derived by hand in the comments.

Constants used below: e^0.5 = 1.64872, e^-0.5 = 0.60653, e^2 = 7.38906, e^0.22 = 1.24608,
e^0.3 = 1.34986, e^-0.3 = 0.74082, e^0.1 = 1.10517.
"""

from __future__ import annotations

import pytest
import torch

from sao.rl.objectives.losses import (
    aggregate,
    dis_mask,
    dis_policy_loss,
    kl_estimates,
    masked_is_weights,
    ppo_clip_loss,
    truncated_is_weights,
    value_loss,
)

E05, EM05, E2 = 1.64872, 0.60653, 7.38906


def t(*xs, grad=False):
    return torch.tensor(xs, dtype=torch.float32, requires_grad=grad)


def close(a, b, atol=1e-4):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=atol)


# ---- DIS -----------------------------------------------------------------------------------------

def test_dis_mask_band():
    # log-ratios 0.5, -0.5, 2.0 -> ratios 1.65, 0.61, 7.39
    logp_rollout, logp_new = t(-1, -1, -1), t(-0.5, -1.5, 1.0)
    # math band (0.7, 6.0): 1.65 inside -> kept; 0.61 < 0.7 -> dropped; 7.39 > 6.0 -> dropped
    assert torch.equal(dis_mask(logp_new, logp_rollout, eps_low=0.3, eps_high=5.0), t(1, 0, 0))
    # coding band (0.2, 4.0): 0.61 > 0.2 -> kept; 7.39 > 4.0 -> dropped
    assert torch.equal(dis_mask(logp_new, logp_rollout, eps_low=0.8, eps_high=3.0), t(1, 1, 0))
    # open interval: ratio exactly 1 with eps_low = 0 (band (1, 6)) is outside
    assert dis_mask(t(0.0), t(0.0), eps_low=0.0, eps_high=5.0).item() == 0.0


def test_dis_loss_value_and_metrics():
    # tokens 0-2 as above (ratios 1.65 kept, 0.61 and 7.39 dropped); token 3 is an observation
    # loss = -(1.64872 * 2) / N, N = 3 action tokens (the 2 dropped ones count) = -1.09915
    logp_new, logp_rollout = t(-0.5, -1.5, 1.0, 5.0), t(-1, -1, -1, 0)
    adv, mask = t(2, -1, 3, 7), t(1, 1, 1, 0)
    loss, m = dis_policy_loss(logp_new, logp_rollout, adv, mask)
    assert loss.item() == pytest.approx(-E05 * 2 / 3, abs=1e-4)
    assert m["dis/mask_frac"] == pytest.approx(2 / 3)
    assert m["dis/mask_low_frac"] == pytest.approx(1 / 3) and m["dis/mask_high_frac"] == pytest.approx(1 / 3)
    assert m["dis/ratio_mean"] == pytest.approx((E05 + EM05 + E2) / 3, abs=1e-4)  # 3.21477


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_dis_zeroes_out_of_band_gradient_on_both_sides_ppo_keeps_one(sign):
    # ratios r = 1.65, 0.61, 7.39 (logp_old = logp_rollout), A = sign for every token, N = 3.
    # Kept token: d/dlogp (-r*A/N) = -r*A/N, since dr/dlogp = r.
    logp_rollout = t(-1, -1, -1)
    adv, mask = torch.full((3,), sign), t(1, 1, 1)

    # DIS, band (0.7, 6.0): only token 0 keeps a gradient, -1.64872*sign/3; tokens 1, 2 exactly 0 for both signs
    logp = t(-0.5, -1.5, 1.0, grad=True)
    dis_policy_loss(logp, logp_rollout, adv, mask)[0].backward()
    assert logp.grad[1].item() == 0.0 and logp.grad[2].item() == 0.0
    assert logp.grad[0].item() == pytest.approx(-E05 * sign / 3, abs=1e-4)

    # PPO, band [0.8, 1.28], per token -min(r*A, clip(r)*A); the min picks:
    #  A > 0: r = 1.65 > 1.28 -> 1.28*A < r*A -> clipped, grad 0
    #         r = 0.61 < 0.8  -> r*A < 0.8*A  -> unclipped, grad -0.60653/3 = -0.20218 (pushes r up, toward the band)
    #         r = 7.39        -> clipped, grad 0
    #  A < 0: r = 1.65        -> r*A = -1.65 < -1.28 -> unclipped, grad +1.64872/3 = 0.54957 (pushes r down)
    #         r = 0.61        -> r*A = -0.61 > -0.8 -> clipped, grad 0
    #         r = 7.39        -> unclipped, grad +7.38906/3 = 2.46302
    # So PPO keeps the gradient on the side that moves r back toward the band; DIS keeps neither.
    logp = t(-0.5, -1.5, 1.0, grad=True)
    ppo_clip_loss(logp, logp_rollout, adv, mask)[0].backward()
    expected = [0.0, -EM05 / 3, 0.0] if sign > 0 else [E05 / 3, 0.0, E2 / 3]
    assert close(logp.grad, expected)

    # dual-clip c = 3 for A < 0: loss capped at -c*A = 3; token 2 has r*|A| = 7.39 > 3 -> capped, grad 0;
    # token 0 has 1.65 < 3 -> unchanged. For A > 0 dual-clip changes nothing.
    logp = t(-0.5, -1.5, 1.0, grad=True)
    ppo_clip_loss(logp, logp_rollout, adv, mask, dual_clip_c=3.0)[0].backward()
    expected = [0.0, -EM05 / 3, 0.0] if sign > 0 else [E05 / 3, 0.0, 0.0]
    assert close(logp.grad, expected)


def test_dis_overflowing_ratio_gives_finite_zero_gradient():
    # log-ratio 100 -> ratio overflows to inf -> dropped; its gradient is exactly 0, not NaN.
    # token 1: ratio 1, A = 1 -> grad -1/2
    logp = t(100.0, 0.0, grad=True)
    loss, _ = dis_policy_loss(logp, t(0, 0), t(1, 1), t(1, 1))
    loss.backward()
    assert torch.equal(logp.grad, t(0.0, -0.5))
    assert loss.item() == pytest.approx(-0.5)


# ---- PPO -----------------------------------------------------------------------------------------

def test_ppo_clip_higher_by_hand():
    # log-ratios 0.22, 0.3, -0.3, 0.1 -> r = 1.24608, 1.34986, 0.74082, 1.10517; A = 1, 1, 1, -1
    # clip-higher band [0.8, 1.28]:
    #   t0: min(1.24608, 1.24608) = 1.24608       (inside; a symmetric 0.2 clip would cap it at 1.2)
    #   t1: min(1.34986, 1.28)    = 1.28          (clipped)
    #   t2: min(0.74082, 0.8)     = 0.74082       (A > 0, r < 0.8: the unclipped term is smaller)
    #   t3: min(-1.10517, -1.10517) = -1.10517
    #   loss = -(1.24608 + 1.28 + 0.74082 - 1.10517) / 4 = -2.16173 / 4 = -0.54043; clipped: t1 -> 1/4
    logp_old = t(0, 0, 0, 0)
    logp_new, adv, mask = t(0.22, 0.3, -0.3, 0.1), t(1, 1, 1, -1), t(1, 1, 1, 1)
    loss, m = ppo_clip_loss(logp_new, logp_old, adv, mask)
    assert loss.item() == pytest.approx(-0.54043, abs=1e-4)
    assert m["ppo/clip_frac"] == pytest.approx(0.25) and m["ppo/dual_clip_frac"] == 0.0
    # symmetric eps 0.2: t0 -> 1.2, t1 -> 1.2: -(1.2 + 1.2 + 0.74082 - 1.10517)/4 = -0.50891; clipped: t0, t1
    loss, m = ppo_clip_loss(logp_new, logp_old, adv, mask, eps_high=0.2)
    assert loss.item() == pytest.approx(-0.50891, abs=1e-4)
    assert m["ppo/clip_frac"] == pytest.approx(0.5)


def test_ppo_dual_clip_and_is_weights_by_hand():
    # log-ratios 2.0, 0.5 -> r = 7.38906, 1.64872; A = -1, -2; band [0.8, 1.28]
    #   t0: min(-7.38906, -1.28) = -7.38906 -> loss term 7.38906
    #   t1: min(-3.29744, -2.56) = -3.29744 -> loss term 3.29744
    # plain: (7.38906 + 3.29744)/2 = 5.34325
    # dual-clip c = 3: t0 capped at -c*A = 3; t1 3.29744 < 6 unchanged -> (3 + 3.29744)/2 = 3.14872
    logp_new, logp_old, adv, mask = t(2.0, 0.5), t(0, 0), t(-1, -2), t(1, 1)
    assert ppo_clip_loss(logp_new, logp_old, adv, mask)[0].item() == pytest.approx(5.34325, abs=1e-4)
    loss, m = ppo_clip_loss(logp_new, logp_old, adv, mask, dual_clip_c=3.0)
    assert loss.item() == pytest.approx(3.14872, abs=1e-4) and m["ppo/dual_clip_frac"] == 0.5
    # per-token IS weights [0.5, 0]: (0.5 * 7.38906 + 0)/2 = 1.84726
    weighted = ppo_clip_loss(logp_new, logp_old, adv, mask, is_weights=t(0.5, 0.0))[0]
    assert weighted.item() == pytest.approx(1.84726, abs=1e-4)
    with pytest.raises(ValueError):
        ppo_clip_loss(logp_new, logp_old, adv, mask, dual_clip_c=1.0)


# ---- off-policy IS weights -----------------------------------------------------------------------

def test_truncated_and_masked_is_weights():
    # pi_old / pi_rollout = e^0.5, e^-0.5, e^2 = 1.64872, 0.60653, 7.38906
    logp_old, logp_rollout = t(0.5, -0.5, 2.0, grad=True), t(0, 0, 0)
    w = truncated_is_weights(logp_old, logp_rollout, cap=2.0)  # min(., 2) -> 1.64872, 0.60653, 2
    assert close(w, [E05, EM05, 2.0]) and not w.requires_grad
    # IcePop [0.5, 5]: 7.39 outside -> 0; [0.7, 5]: 0.61 < 0.7 -> 0 too
    assert close(masked_is_weights(logp_old, logp_rollout, 0.5, 5.0), [E05, EM05, 0.0])
    assert close(masked_is_weights(logp_old, logp_rollout, 0.7, 5.0), [E05, 0.0, 0.0])
    # closed interval: ratio exactly 1 in [1, 1] is kept
    assert masked_is_weights(t(0.0), t(0.0), 1.0, 1.0).item() == 1.0


# ---- value loss ----------------------------------------------------------------------------------

def test_value_loss_clipped_vs_plain_by_hand():
    # V = [0.5, 0.9], V_old = [0.6, 0.6], R = [1, 1], clip 0.2; token 2 an observation (ignored)
    #   t0: unclipped (0.5-1)^2 = 0.25; V moved -0.1 (inside 0.2) -> clipped V = 0.5 -> 0.25; max 0.25
    #   t1: unclipped (0.9-1)^2 = 0.01; V moved +0.3 -> clipped V = 0.8 -> (0.8-1)^2 = 0.04; max 0.04 (clipped wins)
    #   loss = 0.5 * (0.25 + 0.04) / 2 = 0.0725; grad: t0 0.5*2*(0.5-1)/2 = -0.25, t1 0 (constant branch)
    # plain MSE: 0.5 * (0.25 + 0.01) / 2 = 0.065; grad (V-R)/2 = -0.25, -0.05
    old, ret, mask = t(0.6, 0.6, 9.0), t(1.0, 1.0, 9.0), t(1, 1, 0)
    v = t(0.5, 0.9, -9.0, grad=True)
    loss, m = value_loss(v, old, ret, mask)
    loss.backward()
    assert loss.item() == pytest.approx(0.0725) and close(v.grad, [-0.25, 0.0, 0.0])
    assert m["value/clip_frac"] == 0.5 and m["value/mse"] == pytest.approx(0.13)
    v = t(0.5, 0.9, -9.0, grad=True)
    loss, m = value_loss(v, old, ret, mask, clip=None)
    loss.backward()
    assert loss.item() == pytest.approx(0.065) and close(v.grad, [-0.25, -0.05, 0.0])
    assert m["value/clip_frac"] == 0.0


# ---- aggregation ---------------------------------------------------------------------------------

def test_aggregate_modes_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 2 is padding; its NaN is never read
    assert aggregate(x, mask, "token-mean").item() == pytest.approx(7 / 3)  # (1+2+4)/3
    assert aggregate(x, mask, "token-mean", normalizer=7).item() == pytest.approx(1.0)  # 7/7
    assert aggregate(x, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)  # (1.5 + 4)/2; empty row not counted
    assert aggregate(x, mask, "token-sum-norm", normalizer=10).item() == pytest.approx(0.7)  # 7/10
    with pytest.raises(ValueError, match="normalizer"):
        aggregate(x, mask, "token-sum-norm")
    with pytest.raises(ValueError, match="did you mean 'token-mean'"):
        aggregate(x, mask, "token_mean")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "token-sum-norm"])
def test_micro_batches_with_global_normalizer_match_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    b, n = 4, 6
    mask = (torch.rand(b, n, generator=g) < 0.7).int()
    mask[0, :] = 1  # rows hold different token counts
    mask[1, 3:] = 0
    mask[3, :] = 0  # an empty row (e.g. a failed episode): no tokens, no sequence
    logp_rollout = -torch.rand(b, n, generator=g) * 2
    logp_init = logp_rollout + 0.3 * torch.randn(b, n, generator=g)  # some ratios leave the DIS band
    adv = torch.randn(b, n, generator=g)
    values_init, returns = torch.randn(b, n, generator=g), torch.randn(b, n, generator=g)
    # the FULL batch's normalizer: action tokens / non-empty sequences / a constant
    norm = {"token-mean": mask.sum(), "seq-mean-token-mean": (mask.sum(-1) > 0).sum(), "token-sum-norm": 16.0}[mode]

    def losses(rows, normalizer):
        logp = logp_init[rows].clone().requires_grad_()
        values = values_init[rows].clone().requires_grad_()
        kw = {"agg": mode, "normalizer": normalizer}
        total = (dis_policy_loss(logp, logp_rollout[rows], adv[rows], mask[rows], **kw)[0]
                 + ppo_clip_loss(logp, logp_rollout[rows], adv[rows], mask[rows], **kw)[0]
                 + value_loss(values, values_init[rows] - 0.1, returns[rows], mask[rows], **kw)[0])
        total.backward()
        return total.detach(), logp.grad, values.grad

    full = losses(slice(0, 4), None if mode != "token-sum-norm" else norm)  # default normalizer = global here
    first, second = losses(slice(0, 2), norm), losses(slice(2, 4), norm)
    assert torch.allclose(first[0] + second[0], full[0], atol=1e-6)
    for i in (1, 2):
        assert torch.allclose(torch.cat([first[i], second[i]]), full[i], atol=1e-6)
    if mode == "token-mean":
        # without the global normalizer each micro-batch divides by its own count, and the sum is off
        naive = losses(slice(0, 2), None)[0] + losses(slice(2, 4), None)[0]
        assert not torch.allclose(naive, full[0], atol=1e-3)


# ---- KL estimators -------------------------------------------------------------------------------

def test_kl_estimates_by_hand():
    # log_r = logp_ref - logp_new = [-1.5 - (-1.0), -1.0 - (-2.0)] = [-0.5, 1.0]; token 2 masked out
    # k1 = -log_r = [0.5, -1.0] -> mean -0.25
    # k2 = log_r^2/2 = [0.125, 0.5] -> mean 0.3125
    # k3 = e^log_r - 1 - log_r = [0.60653 - 1 + 0.5, 2.71828 - 1 - 1] = [0.10653, 0.71828] -> mean 0.41241
    kl = kl_estimates(t(-1.0, -2.0, 0.0), t(-1.5, -1.0, 50.0), t(1, 1, 0))
    assert kl["kl/k1"] == pytest.approx(-0.25)
    assert kl["kl/k2"] == pytest.approx(0.3125)
    assert kl["kl/k3"] == pytest.approx(0.41241, abs=1e-5)
