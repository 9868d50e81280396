"""The critic's measurements: explained variance pooled and at the first action token (hand-derived
numbers), NaN -- never a number -- where the returns are all equal, and the run summary over the
steps where it is defined."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from sao.agents.records import Trajectory
from sao.rl.algos import SAO
from sao.rl.config import SAOConfig
from sao.rl.learner import (Learner, LearnerConfig, ValueModel, collate, explained_variance,
                            first_action_explained_variance)
from sao.rl.training.critic_summary import critic_summary, critic_summary_of
from sao.rl.training.metrics_log import JsonlSink
from sao.rl.training.trackers.tracker import scalars
from tests.tiny_models import tiny_llama

# ---- explained variance --------------------------------------------------------------------------


def test_explained_variance_by_hand():
    # target [0, 1, 1, 1]: mean 0.75, Var (n - 1) = (0.5625 + 3 x 0.0625) / 3 = 0.25
    # residual [0, 0.5, 0, 0]: mean 0.125, Var = (3 x 0.015625 + 0.140625) / 3 = 0.0625 -> EV = 1 - 0.0625 / 0.25
    target = torch.tensor([0.0, 1.0, 1.0, 1.0])
    assert explained_variance(torch.tensor([0.0, 0.5, 1.0, 1.0]), target) == pytest.approx(0.75)
    # predicting the mean explains nothing; predicting the opposite is worse than nothing
    assert explained_variance(torch.full((4,), 0.75), target) == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == pytest.approx(-3.0)


@pytest.mark.parametrize("target", [[0.0, 0.0, 0.0], [1.0, 1.0], [0.5]])
def test_explained_variance_is_undefined_when_the_returns_are_all_equal(target):
    assert math.isnan(explained_variance(torch.tensor([0.3] * len(target)), torch.tensor(target)))


def first_token_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four rows, T = 5. Row 0: first action at column 2, R = 0; row 1: column 1, R = 1; row 2: column 3,
    R = 1; row 3: no action token (left out). Values are perfect at every later action token."""
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 0, 0]])
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0])
    returns = rewards[:, None] * mask  # gamma = lambda = 1: the reward at every action token
    values = returns.clone().float()
    values[0, 2], values[1, 1], values[2, 3] = 0.0, 1.0, 0.5  # the first-token predictions
    values[3] = 7.0  # a row without actions: never read
    return values, returns.float(), mask


def test_first_action_explained_variance_by_hand():
    values, returns, mask = first_token_case()
    # pairs (0.0, 0), (1.0, 1), (0.5, 1): target mean 2/3, Var = (4/9 + 1/9 + 1/9) / 2 = 1/3
    # residual [0, 0, 0.5]: mean 1/6, Var = (1/36 + 1/36 + 4/36) / 2 = 1/12 -> EV = 1 - (1/12) / (1/3) = 0.75
    assert first_action_explained_variance(values, returns, mask) == pytest.approx(0.75)


def test_a_critic_that_tracks_only_the_later_tokens_gains_nothing_at_the_first():
    values, returns, mask = first_token_case()
    values[0, 2] = values[1, 1] = values[2, 3] = 2 / 3  # the mean outcome at each first token
    act = mask.bool()
    assert explained_variance(values[act], returns[act]) > 0.5  # pooled: the later, perfect tokens dominate
    assert first_action_explained_variance(values, returns, mask) == pytest.approx(0.0, abs=1e-6)


# ---- the SAO update's metrics, and how a NaN travels ----------------------------------------------


def traj(tokens: list[int], actions: list[int], reward: float, task: str) -> Trajectory:
    return Trajectory(episode_id=task, env="fake", task_id=task, sample=0, seed=None, token_ids=tuple(tokens),
                      action_mask=tuple(actions), logprobs=tuple(-0.5 * a for a in actions), turns=(), messages=(),
                      reward=reward, terminated=True, truncated=False, status="ok", info={})


def critic_metrics(rewards: tuple[float, float, float]) -> dict[str, float]:
    batch = collate([traj([3, 4, 5, 6, 7], [0, 0, 1, 1, 1], rewards[0], "a"),
                     traj([3, 8, 9, 10], [0, 0, 1, 1], rewards[1], "b"),
                     traj([3, 11, 12, 13, 14, 15], [0, 0, 0, 1, 1, 1], rewards[2], "c")], pad_id=0)
    policy = tiny_llama()
    learner = Learner(policy, LearnerConfig(lr=1e-3), value_model=ValueModel.from_policy(policy))
    return SAO(SAOConfig(ttur_k=1)).pretrain_critic(learner, batch)


def test_the_critic_step_logs_both_explained_variances():
    metrics = critic_metrics((1.0, 0.0, 1.0))
    assert math.isfinite(metrics["value/explained_var"]) and math.isfinite(metrics["value/explained_var_first"])
    # the fresh head (std 1e-3) predicts about 0 everywhere: near-constant predictions explain about nothing
    assert abs(metrics["value/explained_var_first"]) < 0.05 and abs(metrics["value/explained_var"]) < 0.05


def test_a_batch_whose_rewards_are_all_equal_logs_no_number(tmp_path: Path):
    metrics = critic_metrics((0.0, 0.0, 0.0))
    for key in ("value/explained_var", "value/explained_var_first"):
        assert math.isnan(metrics[key])
        assert key not in scalars(metrics)  # trackers drop it
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.log(3, metrics)
    sink.close()
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["value/explained_var"] is None and row["value/explained_var_first"] is None  # null, not 0


# ---- the run summary -------------------------------------------------------------------------------


def rows_of(ev: dict[int, float | None], first: dict[int, float | None] | None = None) -> list[dict]:
    rows = [{"step": 0, "eval/accuracy": 0.2}]  # the baseline evaluation's line carries no critic metric
    for step, value in ev.items():
        row = {"step": step, "value/explained_var": value}
        if first is not None:
            row["value/explained_var_first"] = first[step]
        rows.append(row)
    return rows


def test_the_summary_averages_the_defined_steps_of_the_second_half_and_the_last_8():
    # 20 steps: the second half is steps 11-20, the last 8 are 13-20; steps 11 and 12 hold 0.9
    ev = {s: 0.0 for s in range(1, 11)} | {11: 0.9, 12: 0.9, 13: 0.1, 14: None, 15: 0.3, 16: None, 17: 0.5,
                                           18: 0.2, 19: None, 20: 0.4}
    (pooled,) = critic_summary(rows_of(ev))
    half, last = pooled.second_half, pooled.last
    assert (half.first_step, half.last_step, half.steps, half.defined) == (11, 20, 10, 7)
    assert half.mean == pytest.approx((0.9 + 0.9 + 0.1 + 0.3 + 0.5 + 0.2 + 0.4) / 7)  # 3.3 / 7
    assert (last.first_step, last.last_step, last.steps, last.defined) == (13, 20, 8, 5)
    assert last.mean == pytest.approx(1.5 / 5)  # 0.1 + 0.3 + 0.5 + 0.2 + 0.4
    text = pooled.describe()
    assert "second half (steps 11-20) +0.471 over 7 of 10 defined steps;" in text
    assert "last 8 (steps 13-20) +0.300 over 5 of 8 defined steps (fewer than 6: too few to judge)" in text


def test_the_summary_covers_the_first_token_key_and_says_when_nothing_was_defined():
    ev = {s: 0.2 for s in range(1, 5)}
    pooled, first = critic_summary(rows_of(ev, {s: None for s in range(1, 5)}))
    assert first.key == "value/explained_var_first" and first.second_half.mean is None
    assert first.second_half.defined == 0 and "undefined over 0 of 2 defined steps" in first.describe()
    assert pooled.second_half.mean == pytest.approx(0.2) and pooled.second_half.steps == 2  # steps 3, 4


def test_a_run_without_a_critic_has_no_summary(tmp_path: Path):
    assert critic_summary([{"step": s, "loss/policy": 0.1} for s in range(1, 5)]) == []
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(r) for r in rows_of({1: 0.5, 2: None, 3: 0.1})]
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "value/expl')  # a torn last line
    (summary,) = critic_summary_of(run)
    assert summary.last.steps == 3 and summary.last.mean == pytest.approx(0.3)
    assert critic_summary_of(run / "metrics.jsonl") == [summary]


def test_sao_report_prints_the_critic_summary(tmp_path: Path, capsys):  # type: ignore[no-untyped-def]
    from sao.rl.training.report import main as report

    rows = rows_of({s: 0.1 * s for s in range(1, 9)}, {s: None if s % 2 else 0.2 for s in range(1, 9)})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert report([str(tmp_path)]) == 0
    printed = capsys.readouterr()
    assert printed.out == f"{tmp_path / 'report.png'}\n"  # the path alone on stdout, the summaries on stderr
    out = printed.err
    # steps 5-8 hold 0.5, 0.6, 0.7, 0.8 -> +0.650; the first-token key is defined at steps 6 and 8 only
    assert f"{tmp_path}: value/explained_var: second half (steps 5-8) +0.650 over 4 of 4 defined steps" in out
    assert "value/explained_var_first: second half (steps 5-8) +0.200 over 2 of 4 defined steps" in out
