"""``learner.sharding`` (sao.rl.learner.sharding): the config's check, the trainer's refusal of the fsdp2 seam, and
FSDP2 on real torch.distributed ranks (gloo, 2 processes): an update on the shards equals the
single-process update on the whole batch, with SGD so that a gradient difference shows up in the
parameters one for one (as tests/test_data_parallel.py does for the replicated learner)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from sao.rl.algos import GRPO
from sao.rl.config import SHARDINGS, LearnerRanksConfig, TrainConfig
from sao.rl.learner.batch import collate
from sao.rl.learner.learner import Learner, LearnerConfig
from sao.rl.learner.sharding import FSDP2_NOT_YET, STRATEGIES, FullyShardedFSDP2, Replicated, make_sharding
from sao.rl.learner.value_model import ValueModel

from tests.test_learner import on_policy, random_trajs
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORLD = 2
LENGTHS = [7, 12, 9, 15, 8, 11, 10]  # 7 rows: shares of 4 and 3, one micro-batch each (no token budget)
STEPS = 2


def _fsdp2_missing() -> str | None:
    """Why FSDP2 cannot run on gloo CPU ranks in this torch, or None."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return f"torch {torch.__version__} has no gloo backend"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard): {exc}"
    return None


# ---- the config and the trainer's refusal (no processes) -------------------------------------------

def test_sharding_config_is_checked_with_the_known_values() -> None:
    assert tuple(STRATEGIES) == SHARDINGS  # the config's names and the strategy classes are one list
    assert LearnerRanksConfig().sharding == "replicate"
    assert LearnerRanksConfig(world_size=2, sharding="fsdp2").sharding == "fsdp2"
    with pytest.raises(ValueError, match=r"unknown learner.sharding 'fsdp'; did you mean 'fsdp2'\? "
                                         r"\(known: replicate, fsdp2\)"):
        LearnerRanksConfig(world_size=2, sharding="fsdp")
    with pytest.raises(ValueError, match=r"needs learner.world_size >= 2 \(got 1\)"):
        LearnerRanksConfig(sharding="fsdp2")
    assert isinstance(make_sharding("replicate"), Replicated)
    assert isinstance(make_sharding("fsdp2"), FullyShardedFSDP2)


def test_the_trainer_refuses_fsdp2_before_any_rank_starts() -> None:
    from sao.rl.learner.parallel.launch import learner_ranks

    cfg = TrainConfig(learner=LearnerRanksConfig(world_size=2, sharding="fsdp2"))
    with pytest.raises(NotImplementedError, match="seam only") as info:
        learner_ranks(cfg, "no-model-is-loaded")
    for part in ("checkpoints", "weight sync", "broadcast_learner", "equal collectives"):
        assert part in str(info.value)
    assert len(FSDP2_NOT_YET) == 4


def test_replicated_leaves_the_model_alone_and_fsdp2_refuses_tied_embeddings() -> None:
    model = tiny_llama(seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    record = Replicated().wrap(model)
    assert (record.strategy, record.world_size, record.units) == ("replicate", 1, ())
    assert record.params == record.local_params == sum(p.numel() for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(NotImplementedError, match="tied input/output embeddings"):
        FullyShardedFSDP2().wrap(tiny_llama(seed=0, tie=True))  # refused before any collective


# ---- FSDP2 on 2 gloo ranks -------------------------------------------------------------------------

def _rows() -> torch.Tensor:
    return torch.randint(1, 64, (6, 10), generator=torch.Generator().manual_seed(1))


def _sgd_steps(model: torch.nn.Module, ids: torch.Tensor, normalizer: float) -> None:
    """STEPS of SGD on -sum(log p(token)) / normalizer over ``ids``, the gradient norm clipped to 1."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits.float()
        logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logp.sum() / normalizer).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the whole model's norm, on the shards too
        opt.step()


def _grpo_learner(policy: torch.nn.Module, dp=None) -> Learner:
    cfg = LearnerConfig(lr=0.05, token_budget=None, grad_clip=1.0)
    return Learner(policy, cfg, data_parallel=dp, policy_optimizer=torch.optim.SGD(policy.parameters(), lr=0.05))


def _grpo_batch():
    return on_policy(collate(random_trajs(LENGTHS), pad_id=0).sorted_by_length(), tiny_llama(seed=0))


def _rank(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from sao.rl.learner.parallel.data_parallel import DataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        sharding = FullyShardedFSDP2()
        # (1) the wrap itself: each rank trains on its rows, normalized by the whole batch's token count
        model = tiny_llama(seed=0)
        record = sharding.wrap(model)
        ids = _rows()
        _sgd_steps(model, ids[rank::WORLD], float(ids[:, 1:].numel()))
        plain = sharding.full_state_dict(model)
        # (2) the learner's policy step on the shards, its all-reduce skipped (FSDP2 has summed)
        policy = tiny_llama(seed=0)
        sharding.wrap(policy)
        learner = _grpo_learner(policy, DataParallel(reduce_grads=not sharding.reduces_grads))
        batch, metrics = _grpo_batch(), []
        for _ in range(STEPS):
            metrics.append(GRPO().update(learner, batch))
        value_record = sharding.wrap(ValueModel.from_policy(tiny_llama(seed=0)))  # the critic's layout
        torch.save({"record": record, "value_record": value_record, "plain": plain, "learner": sharding.full_state_dict(policy),
                    "metrics": metrics}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_fsdp2_on_two_gloo_ranks_gives_the_single_process_update(tmp_path: Path) -> None:
    missing = _fsdp2_missing()
    if missing:
        pytest.skip(missing)
    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]

    # the reference: one process, the whole batch, no wrapper
    model = tiny_llama(seed=0)
    ids = _rows()
    _sgd_steps(model, ids, float(ids[:, 1:].numel()))
    learner = _grpo_learner(tiny_llama(seed=0))
    batch = _grpo_batch()
    ref_metrics = [GRPO().update(learner, batch) for _ in range(STEPS)]
    initial = tiny_llama(seed=0).state_dict()

    record = ranks[0]["record"]
    n_layers = len(model.model.layers)
    assert record.units == (*(f"model.layers.{i}" for i in range(n_layers)), "model", "lm_head", "")
    assert record.params == sum(p.numel() for p in model.parameters())
    assert record.local_params < 0.6 * record.params  # about half of every parameter on each rank
    assert ranks[0]["value_record"].units == (*(f"backbone.layers.{i}" for i in range(n_layers)), "backbone",
                                              "head", "")
    for what, ref in (("plain", model.state_dict()), ("learner", learner.policy.state_dict())):
        assert any(not torch.equal(initial[k], ref[k]) for k in ref), f"{what}: the reference did not train"
        for r, got in enumerate(ranks):
            assert set(got[what]) == set(ref)
            worst = max(float((got[what][k] - ref[k]).abs().max()) for k in ref)
            assert worst <= 1e-6, f"{what}, rank {r}: parameters differ from the single-process update by {worst}"
    for key in ("loss/policy", "grad_norm/policy", "policy/action_tokens"):
        for step, ref_m in enumerate(ref_metrics):
            assert ranks[0]["metrics"][step][key] == pytest.approx(ref_m[key], rel=1e-5, abs=1e-7), (key, step)
