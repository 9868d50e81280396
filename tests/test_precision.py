"""optim.critic_bf16=auto: bf16 autocast where it is fast (sao.rl.precision), as set otherwise."""

from __future__ import annotations

import pytest
import torch

from sao.rl.config import OptimConfig, TrainConfig
from sao.rl.precision import bf16_is_fast, resolve_bf16


def test_auto_follows_the_cpu_amx_check_and_explicit_settings_pass_through():
    assert bf16_is_fast("cpu") == bool(torch.cpu._is_amx_tile_supported())
    assert resolve_bf16("auto", "cpu") == bf16_is_fast("cpu")
    assert [resolve_bf16(v, "cpu") for v in (True, False, None)] == [True, False, None]
    with pytest.raises(ValueError, match="auto, true, false or null"):
        resolve_bf16("yes", "cpu")


def test_the_config_refuses_an_unknown_setting_and_the_learner_gets_the_resolved_one():
    with pytest.raises(ValueError, match="optim.critic_bf16"):
        OptimConfig(critic_bf16="maybe")
    from sao.rl.build import learner_config

    cfg = TrainConfig(device="cpu")
    assert learner_config(cfg).critic_bf16 == bf16_is_fast("cpu")
    cfg.optim.critic_bf16 = True
    assert learner_config(cfg).critic_bf16 is True


def test_auto_is_resolved_for_the_device_the_learner_runs_on(monkeypatch):
    import sao.rl.build as build

    seen = []
    monkeypatch.setattr(build, "resolve_bf16", lambda setting, device: seen.append(torch.device(device)) or False)
    cfg = TrainConfig(device="cuda")  # a data-parallel rank on the CPU of a machine with fewer GPUs than ranks
    build.learner_config(cfg, torch.device("cpu"))
    build.learner_config(cfg)
    assert seen == [torch.device("cpu"), torch.device("cuda")]
