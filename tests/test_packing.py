"""sao.rl.learner.packing: micro-batches run as one padding-free sequence, with the padded run's numbers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from sao.rl.algos import SAO, DISLoss
from sao.rl.learner.batch import collate, micro_batches
from sao.rl.learner.learner import Learner, LearnerConfig, token_logprobs
from sao.rl.learner.packing import Packing, packed_hidden, packing_is_exact
from sao.rl.learner.value_model import ValueModel

from tests.test_learner import on_policy, random_trajs
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_packing_lays_rows_end_to_end_and_puts_them_back():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    x = torch.arange(12).reshape(3, 4) + 1
    p = Packing.of(mask, quantum=4)
    # 3 + 2 + 4 = 9 real tokens -> 12 (a multiple of 4); positions restart per row, then the tail's
    assert p.length == 12
    assert p.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2]]
    assert p.pack(x, fill=0).tolist() == [[1, 2, 3, 5, 6, 9, 10, 11, 12, 0, 0, 0]]
    assert torch.equal(p.unpack(p.pack(x)), x * mask)  # padding comes back as 0
    h = torch.randn(3, 4, 5)
    assert torch.equal(p.unpack(p.pack(h)), h * mask[..., None])
    assert Packing.of(torch.ones(1, 64, dtype=torch.long)).length == 64  # exact fit: no tail


def test_packed_budget_counts_real_tokens():
    b = collate(random_trajs([7, 3, 4, 12, 5]), pad_id=0)
    # padded: [7] | [3, 4] | [12] | [5] (test_learner); packed, 12 real tokens each at most:
    # 7 + 3 = 10, + 4 -> 14 > 12 | 4, + 12 -> 16 | 12 | 5
    assert [m.size for m in micro_batches(b, 12, packed=True)] == [2, 1, 1, 1]
    assert [m.size for m in micro_batches(b, 12)] == [1, 2, 1, 1]


def test_packed_hidden_states_and_logprobs_equal_the_padded_ones():
    model = tiny_llama()
    b = collate(random_trajs([9, 6, 11, 4]), pad_id=0)
    with torch.no_grad():
        padded = model.model(input_ids=b.input_ids, attention_mask=b.attention_mask).last_hidden_state
        packed = packed_hidden(model.model, b.input_ids, b.attention_mask)
        real = b.attention_mask.bool()
        assert torch.allclose(packed[real], padded[real], atol=1e-5)
        assert (packed[~real] == 0).all()
        lp_padded = token_logprobs(model, b.input_ids, b.attention_mask)
        lp_packed = token_logprobs(model, b.input_ids, b.attention_mask, packed=True)
    assert torch.allclose(lp_packed, lp_padded, atol=1e-5)
    assert packing_is_exact(model.model, vocab=64)


def test_a_packed_sao_update_equals_the_padded_one():
    base = tiny_llama()
    b = on_policy(collate(random_trajs([9, 6, 11, 4, 8]), pad_id=0), base)
    out = []
    for pack in (False, True):
        policy = copy.deepcopy(base)
        torch.manual_seed(0)
        value = ValueModel.from_policy(policy)
        learner = Learner(policy, LearnerConfig(lr=1e-2, token_budget=16, pack=pack), value_model=value,
                          policy_optimizer=torch.optim.SGD(policy.parameters(), lr=0.5),
                          value_optimizer=torch.optim.SGD(value.parameters(), lr=0.5))
        metrics = SAO().update(learner, b)
        out.append((policy, value, metrics))
    (p0, v0, m0), (p1, v1, m1) = out
    assert m1["policy/micro_batches"] < m0["policy/micro_batches"]  # packed: fuller micro-batches
    for a, c in zip(list(p0.parameters()) + list(v0.parameters()), list(p1.parameters()) + list(v1.parameters())):
        assert torch.allclose(a, c, atol=1e-6)
    for key in ("loss/policy", "loss/value", "rollout/logprob_gap"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key


class _IgnoresPositions(nn.Module):
    """A trunk that drops ``position_ids`` (so packed rows see each other): packing is not exact."""

    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.trunk = trunk

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):  # noqa: ANN001
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.trunk(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)


def test_a_trunk_that_cannot_pack_is_found():
    assert not packing_is_exact(_IgnoresPositions(tiny_llama().model), vocab=64)


def test_the_learner_pads_when_packing_is_not_exact(monkeypatch, caplog):
    import sao.rl.learner.learner as learner_module

    monkeypatch.setattr(learner_module, "packing_is_exact", lambda trunk, vocab: False)
    policy = tiny_llama()
    learner = Learner(policy, LearnerConfig(pack=True, token_budget=16))
    assert learner.config.pack is False and "packed and padded" in caplog.text
    b = on_policy(collate(random_trajs([9, 6]), pad_id=0), policy)
    # padded: 2 rows x 9 > 16 tokens, two micro-batches (packed, 9 + 6 would fit in one)
    assert learner.policy_step(b, torch.ones(b.input_ids.shape), DISLoss())["policy/micro_batches"] == 2
