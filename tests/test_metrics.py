"""pass@k with hand-derived numbers."""

from __future__ import annotations

import pytest

from sao.evals.metrics import ks_for, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (1, 1, 1, 1.0),
    (1, 0, 1, 0.0),
    (4, 1, 1, 0.25),  # 1 - C(3,1)/C(4,1) = 1 - 3/4
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (4, 3, 2, 1.0),  # n - c = 1 < k: every pair holds a correct one
    (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
])
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_ks_and_mean():
    assert ks_for(1) == [1] and ks_for(2) == [1, 2] and ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6]
    # task A: 1 of 2 correct, task B: 0 of 2 -> pass@1 = (0.5 + 0)/2, pass@2 = (1 + 0)/2
    assert mean_pass_at_k([[True, False], [False, False]]) == {"1": 0.25, "2": 0.5}
