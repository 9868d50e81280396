"""optim.critic_bf16=auto: bf16 autocast where it is fast (sao.rl.learner.precision), as set otherwise."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sao.rl.config import OptimConfig, TrainConfig
from sao.rl.learner import precision
from sao.rl.learner.precision import bf16_is_fast, resolve_bf16


def _cpu(monkeypatch, **flags: bool) -> None:
    monkeypatch.setattr(precision, "_cpu_has", lambda probe: flags.get(probe.removeprefix("_is_").removesuffix("_supported"), False))


def test_auto_by_cpu_kind_and_explicit_settings_pass_through(monkeypatch, tmp_path):
    measured = []
    monkeypatch.setattr(precision, "measured_speedup", lambda: measured.append(1) or 9.0)
    _cpu(monkeypatch, amx_tile=True, avx512_bf16=True)
    assert bf16_is_fast("cpu", cache_dir=tmp_path) is True  # AMX: yes, nothing measured
    _cpu(monkeypatch, amx_tile=False, avx512_bf16=False)
    assert bf16_is_fast("cpu", cache_dir=tmp_path) is False  # no native bf16 (AVX2 only): no
    assert measured == [] and not (tmp_path / precision.CACHE_FILE).exists()
    assert bf16_is_fast("meta") is False
    assert [resolve_bf16(v, "cpu") for v in (True, False, None)] == [True, False, None]
    with pytest.raises(ValueError, match="auto, true, false or null"):
        resolve_bf16("yes", "cpu")


@pytest.mark.parametrize(("speedup", "expected"), [(3.5, True), (1.29, False), (0.7, False)])
def test_avx512_bf16_without_amx_is_measured_once_per_machine_and_cached(monkeypatch, tmp_path, speedup, expected):
    measured = []
    monkeypatch.setattr(precision, "measured_speedup", lambda: measured.append(1) or speedup)
    _cpu(monkeypatch, amx_tile=False, avx512_bf16=True)
    assert bf16_is_fast("cpu", cache_dir=tmp_path) is expected
    assert bf16_is_fast("cpu", cache_dir=tmp_path) is expected  # the second run reads the first's answer
    assert measured == [1]
    cached = json.loads((tmp_path / precision.CACHE_FILE).read_text())
    assert cached[precision.cpu_key()]["speedup"] == speedup
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # another thread count is another key
    try:
        assert bf16_is_fast("cpu", cache_dir=tmp_path) is expected and measured == [1, 1]
    finally:
        torch.set_num_threads(threads)
    (tmp_path / precision.CACHE_FILE).write_text("{not json")  # a damaged cache is measured again, not trusted
    assert bf16_is_fast("cpu", cache_dir=tmp_path) is expected and measured == [1, 1, 1]


def test_ranks_resolving_at_once_measure_once_and_agree(monkeypatch, tmp_path):
    """Data-parallel ranks build their learners at the same time: one measures, the others read its
    answer (a second measurement could land on the other side of the threshold)."""
    import threading
    import time

    answers = iter([2.0, 1.0])  # a first and a second measurement that would disagree

    def measure() -> float:
        time.sleep(0.2)
        return next(answers)

    monkeypatch.setattr(precision, "measured_speedup", measure)
    results: list[bool] = []
    ranks = [threading.Thread(target=lambda: results.append(precision.cached_cpu_decision(tmp_path))) for _ in range(3)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join()
    assert results == [True, True, True]


def test_the_measurement_is_a_real_timing_ratio():
    speedup = precision.measured_speedup(tokens=32, hidden=64, inner=128, rounds=2)
    assert math.isfinite(speedup) and speedup > 0


def test_the_config_refuses_an_unknown_setting_and_the_learner_gets_the_resolved_one():
    with pytest.raises(ValueError, match="optim.critic_bf16"):
        OptimConfig(critic_bf16="maybe")
    from sao.rl.training.build import learner_config

    cfg = TrainConfig(device="cpu")
    assert learner_config(cfg).critic_bf16 == bf16_is_fast("cpu")
    cfg.optim.critic_bf16 = True
    assert learner_config(cfg).critic_bf16 is True


def test_auto_is_resolved_for_the_device_the_learner_runs_on(monkeypatch):
    import sao.rl.training.build as build

    seen = []
    monkeypatch.setattr(build, "resolve_bf16", lambda setting, device: seen.append(torch.device(device)) or False)
    cfg = TrainConfig(device="cuda")  # a data-parallel rank on the CPU of a machine with fewer GPUs than ranks
    build.learner_config(cfg, torch.device("cpu"))
    build.learner_config(cfg)
    assert seen == [torch.device("cpu"), torch.device("cuda")]
