"""The data-parallel learner (sao.rl.learner.parallel.data_parallel) on real torch.distributed ranks (gloo, 2 processes):
the update of N ranks, each training on its share of the rows, equals the single-process update on the
whole batch, for SAO (critic steps, gathered values, advantages, policy step) and GRPO, with SGD so
that a gradient difference shows up in the parameters one for one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from sao.rl.algos import GRPO, SAO
from sao.rl.learner.batch import collate
from sao.rl.learner.learner import Learner, LearnerConfig
from sao.rl.learner.value_model import ValueModel

from tests.test_learner import on_policy, random_trajs
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORLD = 2
LENGTHS = [7, 12, 9, 15, 8, 11, 10]  # 7 rows: uneven shares (4 and 3)
STEPS = 3


def make_learner(algo_name: str, dp=None) -> Learner:
    policy = tiny_llama(seed=0)
    value = ValueModel.from_policy(policy) if algo_name == "sao" else None
    cfg = LearnerConfig(lr=0.05, value_warmup_steps=0, token_budget=24, grad_clip=1.0)
    return Learner(policy, cfg, value_model=value, data_parallel=dp,
                   policy_optimizer=torch.optim.SGD(policy.parameters(), lr=0.05),
                   value_optimizer=torch.optim.SGD(value.parameters(), lr=0.1) if value is not None else None)


def batch_for(policy):
    # rewards 0/1 alternate inside each pair of rows (the same task): non-zero GRPO advantages
    return on_policy(collate(random_trajs(LENGTHS), pad_id=0).sorted_by_length(), policy)


def train(learner: Learner, algo_name: str) -> list[dict[str, float]]:
    algo = SAO() if algo_name == "sao" else GRPO()
    batch = batch_for(tiny_llama(seed=0))  # the same batch on every rank and in the reference
    return [algo.update(learner, batch) for _ in range(STEPS)]


def state_of(learner: Learner) -> dict[str, torch.Tensor]:
    out = {f"policy.{k}": v.detach().clone() for k, v in learner.policy.state_dict().items()}
    if learner.value_model is not None:
        out |= {f"value.{k}": v.detach().clone() for k, v in learner.value_model.state_dict().items()}
    return out


def _rank(rank: int, algo_name: str, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from sao.rl.learner.parallel.data_parallel import DataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        learner = make_learner(algo_name, DataParallel())
        metrics = train(learner, algo_name)
        torch.save({"state": state_of(learner), "metrics": metrics}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.part("torch.distributed")
@pytest.mark.parametrize("algo_name", ["sao", "grpo"])
def test_two_gloo_ranks_give_the_single_process_update(algo_name: str, tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(algo_name, str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD,
                       start_method="spawn")
    reference = make_learner(algo_name)
    ref_metrics = train(reference, algo_name)
    ref = state_of(reference)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    initial = state_of(make_learner(algo_name))
    assert any(not torch.equal(initial[k], ref[k]) for k in ref), "the reference did not train"
    for r, got in enumerate(ranks):
        worst = max(float((got["state"][k] - ref[k]).abs().max()) for k in ref)
        assert worst <= 1e-6, f"rank {r}: parameters differ from the single-process update by {worst}"
    # the logged metrics are the whole batch's, not a rank's share
    for key in ("loss/policy", "rollout/logprob_gap", "grad_norm/policy", "policy/action_tokens"):
        for step, ref_m in enumerate(ref_metrics):
            assert ranks[0]["metrics"][step][key] == pytest.approx(ref_m[key], rel=1e-5, abs=1e-7), (key, step)


# ---- rank 0 leads, the others follow (sao.rl.learner.parallel.ranks) ---------------------------------------------

def _leader_or_follower(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from sao.rl.learner.parallel.data_parallel import DataParallel
    from sao.rl.learner.parallel.messages import Stop
    from sao.rl.learner.parallel.ranks import Channel, LeaderAlgorithm, follow

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    channel = Channel()
    policy = tiny_llama(seed=0)
    torch.manual_seed(100 + rank)  # a different value head on each rank: the leader's must win
    value = ValueModel.from_policy(policy)
    learner = Learner(policy, LearnerConfig(lr=1e-3, token_budget=24, lr_decay="linear", decay_steps=4),
                      value_model=value, data_parallel=DataParallel())
    try:
        if rank == 0:
            leader = LeaderAlgorithm(SAO(), channel, learner)
            leader.share()
            batch = batch_for(tiny_llama(seed=0))
            leader.pretrain_critic(learner, batch)
            for _ in range(2):
                leader.update(learner, batch)
            # a resume: rank 0 loads a state the followers never saw (here: its weights scaled), then shares it
            with torch.no_grad():
                for p in learner.policy.parameters():
                    p.mul_(0.5)
            leader.load_state_dict({})
            leader.update(learner, batch)
            channel.send(Stop())
        else:
            assert follow(learner, SAO(), channel) == 4
        torch.save({"state": state_of(learner), "lr": learner.policy_optimizer.param_groups[0]["lr"]},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_followers_run_the_leaders_calls_and_take_its_state_at_start_and_on_resume(tmp_path: Path) -> None:
    mp.start_processes(_leader_or_follower, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD,
                       start_method="spawn")
    leader, follower = (torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD))
    assert leader["lr"] == follower["lr"] == pytest.approx(1e-3 * (1 - 0.9 * 3 / 3))  # the schedule moved too
    worst = max(float((leader["state"][k] - follower["state"][k]).abs().max()) for k in leader["state"])
    assert worst == 0.0, f"the ranks' learners differ by {worst}"
    # and they trained: the value head is not the follower's own initial one
    torch.manual_seed(101)
    own = ValueModel.from_policy(tiny_llama(seed=0)).state_dict()["head.weight"]
    assert not torch.equal(follower["state"]["value.head.weight"], own)


# ---- the messages, as typed records (sao.rl.learner.parallel.messages), dispatched without ranks ------------------

class _RecordingAlgo:
    """Records the learner calls made on it; ``update`` and ``finish`` return metrics as the real ones do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.state: dict | None = None

    def update(self, learner, batch):
        self.calls.append(("update", batch))
        return {"loss/policy": 1.0}

    def pretrain_critic(self, learner, batch):
        self.calls.append(("pretrain_critic", batch))
        return {"loss/value": 2.0}

    def begin(self, learner):
        self.calls.append(("begin", None))

    def accumulate(self, learner, batch):
        self.calls.append(("accumulate", batch))

    def finish(self, learner):
        self.calls.append(("finish", None))
        return {"loss/policy": 3.0}


class _ScriptedChannel:
    """A channel without ranks: ``recv`` hands out ``script``; ``send`` records."""

    rank = 1

    def __init__(self, script=()) -> None:
        self.script, self.sent = list(script), []

    def send(self, message) -> None:
        self.sent.append(message)

    def recv(self):
        return self.script.pop(0)


def test_a_follower_runs_each_call_record_on_its_algorithm_until_stop() -> None:
    from sao.rl.learner.parallel.messages import Accumulate, Begin, Finish, PretrainCritic, Stop, Update
    from sao.rl.learner.parallel.ranks import follow

    algo = _RecordingAlgo()
    script = [PretrainCritic("b0"), Update("b1"), Begin(), Accumulate("p1"), Accumulate("p2"), Finish(), Stop(),
              Update("never")]
    assert follow(learner=None, algo=algo, channel=_ScriptedChannel(script)) == 6
    assert algo.calls == [("pretrain_critic", "b0"), ("update", "b1"), ("begin", None), ("accumulate", "p1"),
                          ("accumulate", "p2"), ("finish", None)]


def test_the_leader_sends_the_record_then_runs_the_same_call() -> None:
    from sao.rl.learner.parallel.messages import Accumulate, Begin, Finish, Update
    from sao.rl.learner.parallel.ranks import LeaderAlgorithm

    algo, channel = _RecordingAlgo(), _ScriptedChannel()
    algo.uses_critic = False
    leader = LeaderAlgorithm(algo, channel, learner=None)
    assert leader.update(None, "b1") == {"loss/policy": 1.0}
    leader.begin(None)
    leader.accumulate(None, "p1")
    assert leader.finish(None) == {"loss/policy": 3.0}
    assert channel.sent == [Update("b1"), Begin(), Accumulate("p1"), Finish()]
    assert [name for name, _ in algo.calls] == ["update", "begin", "accumulate", "finish"]


def test_an_unknown_message_is_an_error_not_a_method_name() -> None:
    from sao.rl.learner.parallel.ranks import Channel, follow

    with pytest.raises(RuntimeError, match="rank 1: unknown message from rank 0: tuple"):
        follow(learner=None, algo=_RecordingAlgo(), channel=_ScriptedChannel([("call", "update", ("b",))]))
    channel = Channel.__new__(Channel)  # no process group: send refuses before it broadcasts
    with pytest.raises(TypeError, match="not a message record: str .*known: Update, PretrainCritic"):
        channel.send("stop")
