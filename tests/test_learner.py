"""Learner building blocks on a tiny random Llama (hidden 32, 2 layers, vocab 64): batching, token
log-probs, the value model, exact micro-batching, frozen attention, value warm-up, one SAO step."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sao.agents.records import Segment, Trajectory
from sao.rl.algos import SAO, DISLoss, SAOConfig
from sao.rl.learner.batch import collate, micro_batches
from sao.rl.learner.learner import Learner, LearnerConfig, token_logprobs
from sao.rl.learner.value_model import ValueModel

from tests.tiny_models import tiny_llama

VOCAB = 64


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)


def traj(tokens, mask, *, logprobs=None, reward=0.0, truncated=False, task="t0") -> Trajectory:
    return Trajectory(episode_id=f"e{len(tokens)}", env="sao/Test-v0", task_id=task, sample=0, seed=None,
                      token_ids=tuple(tokens), action_mask=tuple(mask),
                      logprobs=tuple(logprobs or [(-1.0 if m else 0.0) for m in mask]), turns=(), messages=(),
                      reward=reward, terminated=not truncated, truncated=truncated, status="ok")


def random_trajs(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        tokens = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        # prompt of 2 tokens, then alternating turns: 3 action tokens, 2 observation tokens, ...
        mask = [0, 0] + [1 if (j % 5) < 3 else 0 for j in range(n - 2)]
        out.append(traj(tokens, mask, reward=float(i % 2), truncated=(i == 1), task=f"t{i // 2}"))
    return out


def on_policy(batch, model, noise=0.1, seed=2):
    """The batch with rollout log-probs = the model's own, plus small noise (ratios near 1, inside DIS)."""
    with torch.no_grad():
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask)
    g = torch.Generator().manual_seed(seed)
    logp = logp + noise * torch.randn(logp.shape, generator=g)
    return replace(batch, rollout_logprobs=logp * batch.action_mask)


# ---- Batch ---------------------------------------------------------------------------------------

def test_collate_pads_right_and_numbers_groups():
    b = collate([traj([5, 6, 7, 8], [0, 0, 1, 1], task="a"), traj([9, 10], [0, 1], truncated=True, task="b"),
                 traj([11, 12, 13], [0, 1, 1], task="a")], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 0, 0], [11, 12, 13, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert b.action_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0]]
    assert b.rollout_logprobs[0].tolist() == [0.0, 0.0, -1.0, -1.0]
    assert b.truncated.tolist() == [False, True, False] and b.group_ids.tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="token 0"):
        collate([traj([1, 2], [1, 1])], pad_id=0)
    # an answer cut by the token budget and graded by the environment (terminated AND truncated) has
    # its final reward: not bootstrapped; one cut before the environment ended it is
    graded_cut = replace(traj([9, 10], [0, 1]), terminated=True, truncated=True)
    assert collate([graded_cut, traj([9, 10], [0, 1], truncated=True)], pad_id=0).truncated.tolist() == [False, True]


def test_collate_trains_each_segment_of_a_split_episode_as_its_own_row_with_the_episode_reward():
    # an external agent's episode (the capture proxy) whose second call re-rendered its history: two
    # sequences the engine saw, [5 6 | 7 8] then [5 9 | 10], laid end to end with the segments' bounds
    split = replace(traj([5, 6, 7, 8, 5, 9, 10], [0, 0, 1, 1, 0, 0, 1], reward=1.0, task="a"),
                    segments=(Segment(0, 4, "first"), Segment(4, 7, "prefix_changed", at=1)))
    b = collate([split, traj([11, 12, 13], [0, 1, 1], task="b")], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8], [5, 9, 10, 0], [11, 12, 13, 0]]
    assert b.action_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0], [0, 1, 1, 0]]
    assert b.rollout_logprobs[1].tolist() == [0.0, 0.0, -1.0, 0.0]
    assert b.rewards.tolist() == [1.0, 1.0, 0.0] and b.group_ids.tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="token 2 .the start of a row"):  # a segment must open with a prompt token
        collate([replace(traj([5, 6, 7], [0, 1, 1]), segments=(Segment(0, 2, "first"), Segment(2, 3, "history_shorter")))],
                pad_id=0)


def test_micro_batches_respect_budget_keep_order_and_trim():
    b = collate(random_trajs([7, 3, 4, 12, 5]), pad_id=0)
    assert [m.size for m in micro_batches(b, None)] == [5]
    mbs = micro_batches(b, 12)
    # rows 7,3 -> 2 x 7 = 14 > 12, so [7] | [3, 4] (2 x 4 = 8; + 12 -> 3 x 12) | [12] | [5]
    assert [m.size for m in mbs] == [1, 2, 1, 1]
    assert [m.input_ids.shape[1] for m in mbs] == [7, 4, 12, 5]  # trimmed to each one's longest row
    assert torch.equal(torch.cat([m.rewards for m in mbs]), b.rewards)
    assert all(m.input_ids.numel() <= 12 for m in mbs)
    assert [m.size for m in micro_batches(b, 1)] == [1] * 5  # a row longer than the budget travels alone
    empty = b.select(torch.arange(0))  # a data-parallel rank's empty share
    assert micro_batches(empty, 12) == [] and micro_batches(empty, None) == []
    with pytest.raises(ValueError, match="token_budget"):
        micro_batches(empty, 0)


# ---- token log-probs -----------------------------------------------------------------------------

def test_token_logprobs_match_naive_gather_and_do_not_depend_on_chunk():
    model = tiny_llama()
    b = collate(random_trajs([9, 6, 11]), pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
    # token t's log-prob comes from the logits at t - 1; token 0 gets 0
    naive = torch.log_softmax(logits[:, :-1], -1).gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
    naive = torch.cat([torch.zeros(3, 1), naive], 1) * b.attention_mask
    for chunk in (1, 3, 1024):
        got = token_logprobs(model, b.input_ids, b.attention_mask, chunk=chunk)
        assert torch.allclose(got, naive, atol=1e-5), chunk
    assert (got[b.attention_mask == 0] == 0).all()
    # gradients agree too (chunks are recomputed in backward)
    grads = []
    for chunk in (2, 1024):
        model.zero_grad()
        token_logprobs(model, b.input_ids, b.attention_mask, chunk=chunk).sum().backward()
        grads.append(model.lm_head.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_token_logprobs_bf16_autocast_is_close():
    model = tiny_llama()
    b = collate(random_trajs([8, 5]), pad_id=0)
    with torch.no_grad():
        fp32 = token_logprobs(model, b.input_ids, b.attention_mask)
        bf16 = token_logprobs(model, b.input_ids, b.attention_mask, bf16=True)
    assert bf16.dtype == torch.float32 and torch.allclose(fp32, bf16, atol=0.1)


# ---- exact micro-batching ------------------------------------------------------------------------

@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_policy_update_does_not_depend_on_token_budget(opt):
    base = tiny_llama()
    b = on_policy(collate(random_trajs([9, 6, 11, 4]), pad_id=0), base)
    adv = torch.randn(b.input_ids.shape, generator=torch.Generator().manual_seed(3))
    results = []
    for budget in (None, 1, 20):  # whole batch; one row each; mixed
        policy = copy.deepcopy(base)
        optimizer = (torch.optim.SGD(policy.parameters(), lr=0.5) if opt == "sgd"
                     else torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.01))
        learner = Learner(policy, LearnerConfig(token_budget=budget, grad_clip=1.0), policy_optimizer=optimizer)
        metrics = learner.policy_step(b, adv, DISLoss())
        results.append((dict(policy.named_parameters()), metrics))
    (ref, m_ref), *others = results
    assert others[0][1]["policy/micro_batches"] == 4 and m_ref["policy/micro_batches"] == 1
    # SGD moves a parameter by lr * grad, so 1e-6 bounds the gradient difference by 2e-6. AdamW's first
    # step is lr * g / (|g| + 1e-8): a gradient of ~3e-9 (seen here) turns fp32 rounding of the order of
    # reductions into update differences of ~4e-7 = 4e-4 * lr, so its bound is 1e-2 * lr.
    atol = 1e-6 if opt == "sgd" else 1e-5
    for params, m in others:
        for name, p in params.items():
            assert torch.allclose(p, ref[name], atol=atol, rtol=0), name
        for key in ("loss/policy", "grad_norm/policy", "dis/mask_frac", "rollout/logprob_gap", "rollout/kl_k3"):
            assert m[key] == pytest.approx(m_ref[key], abs=1e-5), key
    assert any(not torch.equal(p, q) for p, q in zip(ref.values(), base.parameters()))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "token-sum-norm"])
def test_a_step_taken_in_parts_equals_the_whole_batch_step(agg):
    """RolloutPipe's CGP: the batch's parts arrive one by one (each part's loss summed with
    normalizer 1, the sum divided by the whole batch's normalizer at the end). Same update as one
    policy_step on the whole batch, for every aggregation mode."""
    base = tiny_llama()
    trajs = random_trajs([9, 6, 11, 4, 7])
    whole = on_policy(collate(trajs, pad_id=0), base)
    adv = torch.randn(whole.input_ids.shape, generator=torch.Generator().manual_seed(3))
    cfg = LearnerConfig(agg=agg, agg_normalizer=16, grad_clip=1.0)
    ref_policy = copy.deepcopy(base)
    ref = Learner(ref_policy, cfg, policy_optimizer=torch.optim.SGD(ref_policy.parameters(), lr=0.5))
    m_ref = ref.policy_step(whole, adv, DISLoss())
    policy = copy.deepcopy(base)
    learner = Learner(policy, cfg, policy_optimizer=torch.optim.SGD(policy.parameters(), lr=0.5))
    learner.begin_policy_step()
    for rows in ([0, 1], [2], [3, 4]):  # parts padded to their own width, as collate does per part
        part = collate([trajs[i] for i in rows], pad_id=0)
        width = part.input_ids.shape[1]
        part = replace(part, rollout_logprobs=whole.rollout_logprobs[rows, :width])
        learner.accumulate_policy(part, adv[rows, :width], DISLoss())
    m = learner.finish_policy_step()
    for (name, p), q in zip(policy.named_parameters(), ref_policy.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0), name
    assert m["policy/parts"] == 3 and m["policy/action_tokens"] == m_ref["policy/action_tokens"]
    for key in ("loss/policy", "grad_norm/policy", "dis/mask_frac"):
        assert m[key] == pytest.approx(m_ref[key], abs=1e-5), key
    with pytest.raises(RuntimeError, match="begin_policy_step"):
        learner.finish_policy_step()


# ---- value model ---------------------------------------------------------------------------------

def test_value_model_is_an_unshared_copy_of_the_policy_backbone():
    policy = tiny_llama()
    value = ValueModel.from_policy(policy)
    p_state, v_state = policy.model.state_dict(), value.backbone.state_dict()
    assert p_state.keys() == v_state.keys()
    assert all(torch.equal(p_state[k], v_state[k]) for k in p_state)
    assert value.head.weight.shape == (1, 32) and value.head.weight.abs().max() < 0.01  # fresh, small
    policy_ptrs = {p.data_ptr() for p in policy.parameters()}
    assert not policy_ptrs & {p.data_ptr() for p in value.parameters()}
    before = policy.model.layers[0].mlp.up_proj.weight.clone()
    with torch.no_grad():
        value.backbone.layers[0].mlp.up_proj.weight.add_(1.0)
    assert torch.equal(policy.model.layers[0].mlp.up_proj.weight, before)
    b = collate(random_trajs([5, 3]), pad_id=0)
    v = value(b.input_ids, b.attention_mask)
    tv, last = value.token_values(b.input_ids, b.attention_mask)
    assert v.shape == (2, 5) and torch.equal(tv[:, 1:], v[:, :-1]) and (tv[:, 0] == 0).all()
    assert torch.equal(last, torch.stack([v[0, 4], v[1, 2]]))  # each row's final real token


def test_frozen_attention_params_stay_fixed_and_the_rest_trains():
    policy = tiny_llama()
    value = ValueModel.from_policy(policy)
    frozen = value.freeze_attention()
    assert frozen and all(".self_attn." in n for n in frozen)
    for name, p in value.named_parameters():
        assert p.requires_grad == (".self_attn." not in name), name
    assert len(frozen) == 2 * 4  # 2 layers x q/k/v/o (no biases in Llama)
    before = {n: p.detach().clone() for n, p in value.named_parameters()}
    learner = Learner(policy, LearnerConfig(value_lr=1e-2, value_warmup_steps=0), value_model=value)
    b = collate(random_trajs([9, 6]), pad_id=0)
    metrics = learner.value_step(SAO().with_critic_targets(learner, b))
    assert math.isfinite(metrics["loss/value"])
    after = dict(value.named_parameters())
    for name in before:
        changed = not torch.equal(before[name], after[name])
        if ".self_attn." in name:
            assert not changed, name
    assert not torch.equal(before["head.weight"], after["head.weight"])
    mlp = "backbone.layers.1.mlp.down_proj.weight"
    assert not torch.equal(before[mlp], after[mlp])


def test_value_lr_warms_up_linearly():
    policy = tiny_llama()
    learner = Learner(policy, LearnerConfig(lr=1e-6, value_warmup_steps=10), value_model=ValueModel.from_policy(policy))
    b = collate(random_trajs([4]), pad_id=0)
    lrs = [learner.value_step(SAO().with_critic_targets(learner, b))["lr/value"] for _ in range(12)]
    expected = [5e-6 * (i + 1) / 10 for i in range(10)] + [5e-6, 5e-6]
    assert lrs == pytest.approx(expected, rel=1e-9)


def test_the_value_head_takes_its_own_lr_and_the_warm_up_scales_both():
    """optim.value_head_lr: the fresh head in a group of its own. Adam's first step moves each parameter by
    about lr (its sign step), so the head moves by about its own lr and no trunk parameter by more than
    the value lr; the warm-up's factor applies to both groups."""
    policy = tiny_llama()
    value = ValueModel.from_policy(policy)
    cfg = LearnerConfig(value_lr=1e-5, value_head_lr=1e-2, value_warmup_steps=2, weight_decay=0.0)
    learner = Learner(policy, cfg, value_model=value)
    before = {n: p.detach().clone() for n, p in value.named_parameters()}
    b = collate(random_trajs([9, 6]), pad_id=0)
    metrics = learner.value_step(SAO().with_critic_targets(learner, b))
    assert metrics["lr/value"] == pytest.approx(0.5e-5) and metrics["lr/value_head"] == pytest.approx(0.5e-2)
    moved = {n: float((p.detach() - before[n]).abs().max()) for n, p in value.named_parameters()}
    assert moved["head.weight"] == pytest.approx(0.5e-2, rel=0.05), moved["head.weight"]
    trunk = max(v for n, v in moved.items() if not n.startswith("head."))
    assert 0 < trunk <= 0.5e-5 * 1.05, trunk
    with pytest.raises(ValueError, match="value_head_lr"):
        LearnerConfig(value_head_lr=0.0)


def test_without_a_head_lr_the_value_model_is_one_group():
    policy = tiny_llama()
    learner = Learner(policy, LearnerConfig(value_lr=1e-3), value_model=ValueModel.from_policy(policy))
    assert len(learner.value_optimizer.param_groups) == 1
    b = collate(random_trajs([4]), pad_id=0)
    assert "lr/value_head" not in learner.value_step(SAO().with_critic_targets(learner, b))


def test_critic_targets_are_monte_carlo_returns_with_bootstrap_on_truncation():
    policy = tiny_llama()
    learner = Learner(policy, value_model=ValueModel.from_policy(policy))
    # row 0 terminates with R = 1; row 1 is truncated with R = 0.5 (its tokens are all it had so far)
    b = collate([traj([1, 2, 3, 4, 5], [0, 1, 1, 0, 1], reward=1.0),
                 traj([6, 7, 8], [0, 1, 1], reward=0.5, truncated=True)], pad_id=0)
    values, last = learner.predict_values(b)
    t = SAO().with_critic_targets(learner, b, (values, last))
    # gamma = 1, lambda = 1: return = R (+ V(after last token) when truncated) at every action token
    assert torch.allclose(t.returns[0], torch.tensor([0.0, 1, 1, 0, 1]))
    assert torch.allclose(t.returns[1, 1:3], 0.5 + last[1].expand(2)) and t.returns[1, 0] == 0
    assert torch.equal(t.old_values, values)
    adv = SAO().advantages(learner, b, (values, last))
    assert adv[0, -1].item() == pytest.approx(1.0 - values[0, 4].item(), abs=1e-6)  # last action: delta = R - V
    assert (adv[b.action_mask == 0] == 0).all()


# ---- one SAO step --------------------------------------------------------------------------------

def two_trajectory_batch():
    # A: prompt [3, 4, 5], action [6, 7], observation [8, 9], action [10, 11]; terminated, R = 1
    # B: prompt [3, 12], action [13, 14, 15]; truncated, R = 0
    a = traj([3, 4, 5, 6, 7, 8, 9, 10, 11], [0, 0, 0, 1, 1, 0, 0, 1, 1], reward=1.0)
    b = traj([3, 12, 13, 14, 15], [0, 0, 1, 1, 1], reward=0.0, truncated=True, task="t1")
    return collate([a, b], pad_id=0)


def test_one_sao_step_runs_and_updates_the_policy():
    policy = tiny_llama()
    before = [p.detach().clone() for p in policy.parameters()]
    learner = Learner(policy, LearnerConfig(lr=1e-3), value_model=ValueModel.from_policy(policy))
    metrics = SAO().update(learner, on_policy(two_trajectory_batch(), policy))
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["policy/action_tokens"] == 7 and metrics["rollout/logprob_gap"] > 0
    assert 0.0 <= metrics["dis/mask_frac"] < 1.0
    assert any(not torch.equal(p, q) for p, q in zip(before, policy.parameters()))


def test_observation_positions_contribute_no_gradient():
    base = tiny_llama()
    batch = on_policy(two_trajectory_batch(), base)
    adv = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(4))
    obs = batch.action_mask == 0

    def update(b, a):
        policy = copy.deepcopy(base)
        Learner(policy, policy_optimizer=torch.optim.SGD(policy.parameters(), lr=1.0)).policy_step(b, a, DISLoss())
        return torch.cat([p.detach().flatten() for p in policy.parameters()])

    ref = update(batch, adv)
    junk = torch.where(obs, torch.full_like(batch.rollout_logprobs, 3.0), batch.rollout_logprobs)
    assert torch.equal(update(replace(batch, rollout_logprobs=junk), torch.where(obs, 100.0, adv)), ref)
    # and the test is not vacuous: changing an ACTION token's rollout log-prob does change the update
    moved = batch.rollout_logprobs.clone()
    moved[0, 3] += 0.2
    assert not torch.equal(update(replace(batch, rollout_logprobs=moved), adv), ref)


# ---- the real small model (optional) -------------------------------------------------------------

SMOLLM2 = Path.home() / ".cache" / "sao" / "models" / "smollm2-135m"


@pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason=f"{SMOLLM2} is not prepared")
def test_smollm2_step_has_zero_gap_against_its_own_logprobs():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32)
    ids = torch.randint(10, 1000, (2, 24))
    mask = [0] * 8 + [1] * 16
    b = collate([traj(ids[0].tolist(), mask, reward=1.0), traj(ids[1].tolist()[:20], mask[:20], truncated=True)],
                pad_id=0)
    b = on_policy(b, policy, noise=0.0)  # what an engine running the same weights would report
    value = ValueModel.from_policy(policy)
    # SGD keeps this cheap on a CPU (no AdamW state for 2 x 135M parameters); the step is the same code path
    learner = Learner(policy, LearnerConfig(token_budget=24), value_model=value,
                      policy_optimizer=torch.optim.SGD(policy.parameters(), lr=1e-6),
                      value_optimizer=torch.optim.SGD(value.parameters(), lr=5e-6))
    metrics = SAO(SAOConfig(ttur_k=1)).update(learner, b)
    assert math.isfinite(metrics["loss/policy"]) and math.isfinite(metrics["loss/value"])
    assert metrics["rollout/logprob_gap"] < 1e-4 and metrics["dis/mask_frac"] == 0.0


def test_sao_step_under_bf16_autocast_with_micro_batches():
    policy = tiny_llama()
    learner = Learner(policy, LearnerConfig(lr=1e-3, bf16=True, token_budget=9, logprob_chunk=4),
                      value_model=ValueModel.from_policy(policy))
    metrics = SAO().update(learner, on_policy(two_trajectory_batch(), policy))
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["policy/micro_batches"] == 2 and metrics["rollout/logprob_gap"] < 0.5


def test_config_rejects_unknown_aggregation_with_a_hint():
    with pytest.raises(ValueError, match="did you mean 'token-mean'"):
        LearnerConfig(agg="token_mean")
    with pytest.raises(ValueError, match="agg_normalizer"):
        LearnerConfig(agg="token-sum-norm")


# ---- issue 13: what the learner no longer recomputes, and the log-probs it computes only where needed

def test_token_logprobs_only_at_requested_tokens_equal_the_full_computation():
    model = tiny_llama()
    b = collate(random_trajs([9, 14, 6]), pad_id=0)
    with torch.no_grad():
        full = token_logprobs(model, b.input_ids, b.attention_mask)
        only = token_logprobs(model, b.input_ids, b.attention_mask, only=b.action_mask, chunk=4)
    act = b.action_mask.bool()
    assert torch.allclose(only[act], full[act], atol=1e-6)
    assert (only[~act] == 0).all()  # prompt, observation and padding tokens never reach the head


def test_sorted_by_length_keeps_each_row_whole():
    b = collate(random_trajs([9, 4, 14, 6]), pad_id=0)
    s = b.sorted_by_length()
    assert s.attention_mask.sum(-1).tolist() == [4, 6, 9, 14]
    order = [1, 3, 0, 2]  # the rows' original positions, shortest first
    for name in ("input_ids", "action_mask", "rollout_logprobs", "rewards", "truncated", "group_ids"):
        assert torch.equal(getattr(s, name), getattr(b, name)[order]), name
    assert s.sorted_by_length() is s  # already sorted: the same object


def test_first_value_step_equals_targets_from_a_separate_forward_then_a_step():
    """SAO takes its values (for the advantages and the critic targets) from the first critic step's own
    forward pass; the step must be the one a separate no-grad forward + value_step would take."""
    trajs = random_trajs([9, 14, 6, 11])
    learners = []
    for _ in range(2):
        policy = tiny_llama()
        torch.manual_seed(5)
        value = ValueModel.from_policy(policy)
        learners.append(Learner(policy, LearnerConfig(lr=1e-3, value_warmup_steps=0, token_budget=24), value_model=value,
                                policy_optimizer=torch.optim.SGD(policy.parameters(), lr=1e-3),
                                value_optimizer=torch.optim.SGD(value.parameters(), lr=1e-2)))
    sao = SAO(SAOConfig(ttur_k=1))
    b = collate(trajs, pad_id=0)
    a, c = learners
    values = a.predict_values(b)
    m_sep = a.value_step(sao.with_critic_targets(a, b, values))
    m_first, seen = c.first_value_step(b, lambda mb, v, last: sao.with_critic_targets(c, mb, (v, last)))
    assert torch.allclose(seen[0], values[0], atol=1e-6) and torch.allclose(seen[1], values[1], atol=1e-6)
    assert m_first["loss/value"] == pytest.approx(m_sep["loss/value"], rel=1e-5)
    for pa, pc in zip(a.value_model.parameters(), c.value_model.parameters()):
        assert torch.allclose(pa, pc, atol=1e-6)


def test_activation_checkpointing_gives_the_same_gradients_and_keeps_dropout_off():
    from sao.rl.learner.activation_recompute import enable_activation_checkpointing

    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    grads = []
    for checkpointed in (False, True):
        model = tiny_llama()
        if checkpointed:
            assert enable_activation_checkpointing(model) == 2
            assert all(not m.training for m in model.modules() if isinstance(m, torch.nn.Dropout))
            assert not model.training  # the model stays in eval mode; only its layers' switch is on
        calls = []
        # (not the MLP: the recompute stops once the last saved tensor, inside the MLP, is back)
        model.model.layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
        loss = model(ids).logits.log_softmax(-1).mean()
        loss.backward()
        assert len(calls) == (2 if checkpointed else 1)  # recomputed in the backward pass
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-7, msg=name)
    value = ValueModel.from_policy(tiny_llama())
    assert enable_activation_checkpointing(value) == 2


def test_activation_checkpointing_is_on_for_long_trajectories_only():
    from sao.rl.config import TrainConfig, activation_checkpointing

    cfg = TrainConfig()
    assert not activation_checkpointing(cfg)  # arithmetic: 128-256 tokens
    cfg.env.max_tokens, cfg.engine.max_model_len = 1024, 2048
    assert activation_checkpointing(cfg)
    cfg.model.activation_checkpointing = False
    assert not activation_checkpointing(cfg)


# ---- the policy's lr schedule --------------------------------------------------------------------

def test_lr_schedule_shapes_and_checks():
    from sao.rl.learner.lr_schedule import LrSchedule

    assert [LrSchedule().factor(s) for s in (0, 5, 100)] == [1.0, 1.0, 1.0]
    lin = LrSchedule("linear", steps=5, min_ratio=0.2)
    assert [lin.factor(s) for s in range(7)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2])
    cos = LrSchedule("cosine", steps=3, min_ratio=0.0)
    assert [cos.factor(s) for s in range(4)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="known: constant, linear, cosine"):
        LrSchedule("cos", steps=3)
    with pytest.raises(ValueError, match="needs the run's steps"):
        LrSchedule("linear")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        LrSchedule("linear", steps=3, min_ratio=1.5)


def test_policy_lr_follows_the_schedule_and_a_checkpoint_resumes_it(tmp_path):
    from sao.rl.training.checkpoint import Checkpointer, TrainState

    cfg = LearnerConfig(lr=1e-3, lr_decay="linear", decay_steps=4, min_lr_ratio=0.25)
    policy = tiny_llama()
    learner = Learner(policy, cfg)
    batch = on_policy(two_trajectory_batch(), policy)
    from sao.rl.algos import GRPO

    lrs = [GRPO().update(learner, batch)["optim/lr"] for _ in range(2)]
    assert lrs == pytest.approx([1e-3, 0.75e-3])
    ckpt = Checkpointer(tmp_path).save(learner, TrainState(2, 2, 0, {}, {}))
    resumed = Learner(tiny_llama(seed=5), cfg)  # a fresh learner starts the schedule at step 0 ...
    Checkpointer.load(ckpt, resumed)  # ... and the checkpoint puts it back at step 2
    lrs += [GRPO().update(resumed, batch)["optim/lr"] for _ in range(3)]
    assert lrs == pytest.approx([1e-3, 0.75e-3, 0.5e-3, 0.25e-3, 0.25e-3])
