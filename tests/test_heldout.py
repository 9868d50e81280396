"""Held-out evaluation (sao.rl.training.heldout) and the arithmetic split it rests on; hand-derived numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sao.envs.arithmetic import ArithmeticTasks, in_test_split, make_task
from sao.rl.training.heldout import distinct_tasks, improvement, paired_difference, wilson_interval


def test_wilson_interval_by_hand():
    # 20 of 100: p = 0.2, z = 1.96; centre = (0.2 + 1.96^2/200) / (1 + 1.96^2/100) = 0.21921 / 1.038415 = 0.21110
    # half = 1.96 * sqrt(0.0016 + 1.96^2/40000) / 1.038415 = 1.96 * 0.041191 / 1.038415 = 0.077748
    iv = wilson_interval(20, 100)
    assert iv.value == 0.2
    assert iv.low == pytest.approx(0.21110 - 0.077748, abs=1e-4) and iv.high == pytest.approx(0.21110 + 0.077748, abs=1e-4)
    assert wilson_interval(0, 10).low == pytest.approx(0.0, abs=1e-12) and wilson_interval(10, 10).high == pytest.approx(1.0)
    assert math.isnan(wilson_interval(0, 0).value)


def test_paired_difference_by_hand():
    # differences after - before: +1, +1, 0, 0, -1, 0, +1, 0 -> mean 2/8 = 0.25
    # sample variance: (3 * 0.75^2 + 4 * 0.25^2 + 1.25^2) / 7 = (1.6875 + 0.25 + 1.5625) / 7 = 0.5
    # half = 1.96 * sqrt(0.5 / 8) = 1.96 * 0.25 = 0.49
    before = [0, 0, 1, 0, 1, 1, 0, 0]
    after = [1, 1, 1, 0, 0, 1, 1, 0]
    d = paired_difference([bool(x) for x in before], [bool(x) for x in after])
    assert d.value == pytest.approx(0.25)
    assert d.low == pytest.approx(0.25 - 0.48999, abs=1e-3) and d.high == pytest.approx(0.25 + 0.48999, abs=1e-3)
    with pytest.raises(ValueError):
        paired_difference([True], [True, False])


def test_improvement_reads_the_first_and_last_evaluation(tmp_path: Path):
    path = tmp_path / "eval.jsonl"
    rows = [(0, "a", False), (0, "b", False), (0, "c", True), (10, "a", True), (10, "b", False), (10, "c", True),
            (20, "a", True), (20, "b", True), (20, "c", True)]
    path.write_text("".join(json.dumps({"step": s, "task_id": t, "correct": c}) + "\n" for s, t, c in rows)
                    + '{"step": 20, "task_')  # a torn last line (a kill mid-write) is skipped
    first, last, before, after, delta = improvement(path)
    assert (first, last) == (0, 20)
    assert before.value == pytest.approx(1 / 3) and after.value == 1.0 and delta.value == pytest.approx(2 / 3)
    assert improvement(tmp_path / "missing.jsonl") is None


def test_the_test_split_is_never_drawn_for_training():
    train = ArithmeticTasks(seed=3, difficulty=0.5, ops="+-", max_digits=2, split="train")
    test = ArithmeticTasks(seed=3, difficulty=0.5, ops="+-", max_digits=2, split="test")
    train_problems = {train.get(t).problem for t in train.ids(3000)}
    test_problems = {test.get(t).problem for t in test.ids(300)}
    assert not train_problems & test_problems
    assert all(in_test_split(p) for p in test_problems) and not any(in_test_split(p) for p in train_problems)
    # ids carry the split and rebuild the same task; the unsplit stream keeps its old ids and tasks
    t = make_task("sub", 2, 3, 17, "test")
    assert t.task_id == "sub-d2-s3-i17-test" and test.get(t.task_id) == t
    assert make_task("sub", 2, 3, 17).task_id == "sub-d2-s3-i17"
    with pytest.raises(ValueError):
        ArithmeticTasks(split="holdout")


def test_distinct_tasks_count_a_repeated_problem_once():
    # 1-digit addition has 100 problems, about 20 of them in the test split: far fewer than asked for
    ids = distinct_tasks("arithmetic", {"ops": "+", "max_digits": 1, "split": "test"}, 200)
    problems = [ArithmeticTasks(ops="+", max_digits=1).get(i).problem for i in ids]
    assert len(set(problems)) == len(problems) and 10 <= len(ids) < 40
    assert len(distinct_tasks("arithmetic", {"ops": "+-", "max_digits": 2, "difficulty": 0.5, "split": "test"}, 50)) == 50


def test_allocator_setup_and_rss_readings():
    from sao.rl.learner.memory import configure_allocator, rss_gb

    assert configure_allocator() in (True, False)  # glibc here: True; idempotent
    now, peak = rss_gb()
    assert 0 < now <= peak


@pytest.mark.parametrize("preset", [None, "7"])
def test_configure_allocator_caps_onednn_primitive_cache_unless_the_user_set_it(preset):
    import os
    import subprocess
    import sys

    from sao.rl.learner.memory import ONEDNN_CACHE_CAPACITY

    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if preset is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = preset
    code = ("import os; from sao.rl.learner.memory import configure_allocator; configure_allocator(); "
            "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (preset or str(ONEDNN_CACHE_CAPACITY))
