"""benchmarks/critic_fit.py's pure parts: the split by task, the first-token ceiling by hand, the settings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.benchmark_module import load

critic_fit = load("critic_fit")


def test_the_split_keeps_every_sample_of_a_prompt_on_one_side():
    episodes = critic_fit.synthetic(60)
    episodes += [replace(ep, episode_id=ep.episode_id + "b", sample=1) for ep in episodes]
    fit, held = critic_fit.split(episodes, 0.25)
    assert len(fit) + len(held) == 120 and held and fit
    assert not {t.task_id for t in fit} & {t.task_id for t in held}


def test_the_first_token_ceiling_by_hand():
    # prompt A [1, 1, 0], prompt B [0, 0, 0]: mean 1/3, Var (population) 2/9; prompt means 2/3 and 0:
    # between = 3 x (1/3)^2 x 2 / 6 = 1/9; noise = (Var(A) = 1/3 + Var(B) = 0) / 6 = 1/18
    # ceiling = (1/9 - 1/18) / (2/9) = 1/4
    base = critic_fit.synthetic(1)[0]
    episodes = [replace(base, task_id=task, reward=r)
                for task, rewards in (("A", [1.0, 1.0, 0.0]), ("B", [0.0, 0.0, 0.0]), ("C", [1.0])) for r in rewards]
    ceiling, covered = critic_fit.first_token_ceiling(episodes)
    assert covered == 6 and ceiling == pytest.approx(0.25)  # prompt C, sampled once, is left out


def test_settings_compose_with_plus():
    assert critic_fit.overrides("lr5e-5+k4") == ["optim.value_lr=5e-5", "algo.ttur_k=4"]
    assert critic_fit.overrides("default") == []
    with pytest.raises(SystemExit):
        critic_fit.parse_args(["x.jsonl", "--settings", "lr5e-5+nope"])


def test_the_probe_finds_a_signal_in_the_features_and_none_where_there_is_none():
    """benchmarks/critic_probe.py's ridge fit: a reward written in one feature is recovered on held-out
    episodes (EV near 1 pooled and at the first token); features unrelated to the reward explain nothing."""
    import numpy as np

    probe = load("critic_probe")
    rng = np.random.default_rng(0)

    def episodes(n: int, signal: bool) -> list:
        out = []
        for _ in range(n):
            reward = float(rng.integers(0, 2))
            f = rng.normal(size=(5, 8))
            if signal:
                f[:, 3] += 6.0 * reward  # linear R^2 of a 0/1 reward from it: 0.9
            out.append((f, reward))
        return out

    pooled, first = probe.ridge_scores(episodes(200, True), episodes(60, True), ridge=1.0)
    assert pooled > 0.8 and first > 0.8
    pooled, first = probe.ridge_scores(episodes(200, False), episodes(60, False), ridge=1.0)
    assert abs(pooled) < 0.15 and abs(first) < 0.25
