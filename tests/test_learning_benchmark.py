"""The statistics and aggregation of benchmarks/learning_arithmetic.py, on hand-derived numbers (no engine)."""

from __future__ import annotations

import math

import pytest

from tests.benchmark_module import load

bench = load("learning_arithmetic")


def test_t_interval_over_seeds():
    # values 0.1, 0.2, 0.3: mean 0.2, sd = sqrt((0.01 + 0 + 0.01) / 2) = 0.1,
    # half = t_{0.975, 2} * 0.1 / sqrt(3) = 4.303 * 0.05774 = 0.2484
    i = bench.t_interval([0.1, 0.2, 0.3])
    assert i.value == pytest.approx(0.2)
    assert i.low == pytest.approx(0.2 - 0.24844, abs=1e-4)
    assert i.high == pytest.approx(0.2 + 0.24844, abs=1e-4)
    one = bench.t_interval([0.5])  # one seed: a mean, no interval
    assert one.value == 0.5 and math.isnan(one.low) and math.isnan(one.high)
    assert bench.t_quantile(100) == pytest.approx(1.96, abs=1e-3)


def test_curve_pools_seeds_at_shared_steps():
    # seed A: step 0 -> 1 of 2 right, step 5 -> 2 of 2; seed B: step 0 -> 0 of 2, step 5 -> 1 of 2,
    # step 10 only in A (dropped: not every seed has it)
    a = {0: {"t1": True, "t2": False}, 5: {"t1": True, "t2": True}, 10: {"t1": True, "t2": True}}
    b = {0: {"u1": False, "u2": False}, 5: {"u1": True, "u2": False}}
    points = bench.curve([a, b])
    assert [p.step for p in points] == [0, 5]
    # step 0: per seed 0.5 and 0.0 -> mean 0.25; pooled 1 of 4 -> Wilson(1, 4) centre 0.25
    assert points[0].per_seed == (0.5, 0.0) and points[0].mean == pytest.approx(0.25)
    assert points[0].n == 4 and points[0].pooled.value == pytest.approx(0.25)
    # Wilson(1, 4): centre (0.25 + 3.8415/8) / (1 + 3.8415/4) = 0.7302 / 1.9604 = 0.3725,
    # half 1.96 * sqrt(0.1875/4 + 3.8415/64) / 1.9604 = 1.96 * sqrt(0.1069) / 1.9604 = 0.3269 -> [0.0456, 0.6994]
    assert points[0].pooled.low == pytest.approx(0.0456, abs=1e-3)
    assert points[0].pooled.high == pytest.approx(0.6994, abs=1e-3)
    assert points[1].mean == pytest.approx(0.75)  # (1.0 + 0.5) / 2


def test_improvement_per_seed_over_seeds_and_pooled():
    # seed A (first 0, last 5): t1 F->T, t2 F->F  -> diffs +1, 0 -> delta +0.5
    # seed B (first 0, last 5): u1 T->T, u2 T->F  -> diffs 0, -1 -> delta -0.5
    a = {0: {"t1": False, "t2": False}, 5: {"t1": True, "t2": False}}
    b = {0: {"u1": True, "u2": True}, 5: {"u1": True, "u2": False}}
    imp = bench.improvement_stats([a, b, {0: {"v": True}}])  # a run with one evaluation is left out
    assert imp.per_seed == (0.5, -0.5)
    # over seeds: mean 0, sd = sqrt((0.25 + 0.25) / 1) = 0.7071, half = 12.706 * 0.7071 / sqrt(2) = 6.353
    assert imp.over_seeds.value == pytest.approx(0.0)
    assert imp.over_seeds.high == pytest.approx(6.353, abs=1e-3)
    # pooled: diffs (+1, 0, 0, -1): mean 0, sd = sqrt(2/3) = 0.8165, half = 1.96 * 0.8165 / 2 = 0.8002
    assert imp.pooled.value == pytest.approx(0.0)
    assert imp.pooled.high == pytest.approx(0.8002, abs=1e-3)
    assert bench.improvement_stats([{0: {"v": True}}]) is None


def test_train_seconds_exclude_evaluations_and_count_critic_batches():
    # critic batches 10 + 12 = 22 s; step 1: 16 s, no eval -> 38; step 2: 60 s of which 40 eval -> 58
    metrics = [{"step": 0, "perf/eval_s": 40.0}, {"step": 1, "perf/step_s": 16.0},
               {"step": 2, "perf/step_s": 60.0, "perf/eval_s": 40.0}]
    pretrain = [{"pretrain_step": 1, "perf/step_s": 10.0}, {"pretrain_step": 2, "perf/step_s": 12.0}]
    assert bench.train_seconds(metrics, pretrain) == {0: 22.0, 1: 38.0, 2: 58.0}


def test_time_to_reach_and_the_budget_arithmetic():
    points = [(0.0, 0.0), (100.0, 0.02), (200.0, 0.06), (300.0, 0.05)]
    assert bench.time_to_reach(points, 0.05) == 200.0  # first point at or above the target
    assert bench.time_to_reach(points, 0.10) is None  # never reached
    assert bench.time_to_reach(points, 0.0) is None  # no gain to reach
    assert bench.time_to_reach(points, math.nan) is None
    # SAO, 2 critic batches of 8: an evaluation after step 5 has seen (2 + 5) * 8 = 56 trajectories
    assert bench.trajectories_seen(5, 8, 2) == 56 and bench.trajectories_seen(0, 8, 2) == 0
    # 20 batches, 5 points: every ceil(20 / 4) = 5 -> steps 0, 5, 10, 15, 20
    assert bench.eval_every(20, 5) == 5 and bench.eval_every(2, 5) == 1


def test_collapse_is_a_later_evaluation_more_than_10_points_below_the_start():
    stats = load("learning_stats")
    start = {f"t{i}": i < 5 for i in range(10)}  # 0.5
    down_10 = {f"t{i}": i < 4 for i in range(10)}  # 0.4: exactly 10 points, not more
    down_20 = {f"t{i}": i < 3 for i in range(10)}  # 0.3
    assert not stats.collapsed({0: start, 5: down_10, 10: start})
    assert stats.collapsed({0: start, 5: down_20, 10: start})  # a dip counts, even if the run recovers
    assert not stats.collapsed({0: start})
    assert not stats.collapsed({0: down_20, 5: start})


def test_arm_difference_pairs_seeds_and_problems():
    stats = load("learning_stats")
    # seed 1: A goes t1 F->T, t2 F->F (+0.5); B t1 F->F, t2 F->F (0)  -> per-problem d = (+1, 0), seed +0.5
    # seed 2: A t1 T->T, t2 T->F (-0.5); B t1 F->T, t2 T->T (+0.5)    -> d = (0 - 1, -1 - 0) = (-1, -1), seed -1.0
    # seed 3 only in A: left out
    a = {1: {0: {"t1": False, "t2": False}, 9: {"t1": True, "t2": False}},
         2: {0: {"t1": True, "t2": True}, 9: {"t1": True, "t2": False}},
         3: {0: {"t1": True}, 9: {"t1": True}}}
    b = {1: {0: {"t1": False, "t2": False}, 9: {"t1": False, "t2": False}},
         2: {0: {"t1": False, "t2": True}, 9: {"t1": True, "t2": True}}}
    d = stats.arm_difference(a, b)
    assert d.seeds == (1, 2) and d.per_seed == (0.5, -1.0)
    # over seeds: mean -0.25, sd = sqrt((0.5625 + 0.5625) / 1) = 1.0607, half = 12.706 * 1.0607 / sqrt(2) = 9.530
    assert d.over_seeds.value == pytest.approx(-0.25)
    assert d.over_seeds.high == pytest.approx(-0.25 + 9.530, abs=1e-3)
    # pooled d = (1, 0, -1, -1): mean -0.25, sd = sqrt((1.5625 + 0.0625 + 0.5625 * 2) / 3) = 0.9574,
    # half = 1.96 * 0.9574 / 2 = 0.9383
    assert d.pooled.value == pytest.approx(-0.25)
    assert d.pooled.low == pytest.approx(-0.25 - 0.9383, abs=1e-3)
    assert stats.arm_difference(a, {}) is None
