"""The tagged algorithm config: ``algo=NAME`` composes NAME's own typed config (sao.rl.config.ALGO_CONFIGS),
the registry of classes has the same names, and an option the algorithm lacks is an error that names the
options it has, whether it comes from code, from Hydra or from sao-train's command line."""

from __future__ import annotations

from importlib import resources

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

import sao.rl.cli.train  # noqa: F401  (registers the schemas)
from sao.rl.algos import ALGORITHMS, GRPO, PPO, SAO, DISLoss, PPOClipLoss, make_algorithm
from sao.rl.cli.algo_group import check_overrides, default_algo
from sao.rl.cli.train import to_config
from sao.rl.config import (
    ALGO_CONFIGS,
    ConfigError,
    CriticAlgoConfig,
    GRPOConfig,
    GRPODISConfig,
    PPOConfig,
    SAOConfig,
    algo_config,
)
from sao.rl.training.build import learner_config


def composed(*overrides: str):  # type: ignore[no-untyped-def]
    with initialize_config_module("sao.conf", version_base="1.3"):
        return to_config(compose("config", overrides=list(overrides)))


def test_one_config_and_one_class_per_algo_option() -> None:
    files = {p.name.removesuffix(".yaml") for p in (resources.files("sao.conf") / "algo").iterdir()
             if p.name.endswith(".yaml")}
    assert set(ALGO_CONFIGS) == set(ALGORITHMS) == files
    for name, schema in ALGO_CONFIGS.items():
        cfg = composed(f"algo={name}").algo
        assert type(cfg) is schema and cfg.name == name
        assert isinstance(make_algorithm(cfg), ALGORITHMS[name])


def test_the_composed_knobs_reach_the_algorithm() -> None:
    grpo = make_algorithm(composed("algo=grpo", "algo.scale_by_std=false", "algo.is_correction=tis").algo)
    assert isinstance(grpo, GRPO) and grpo.config.scale_by_std is False
    assert grpo.loss == PPOClipLoss(0.2, 0.28, None, "tis", 2.0, 0.5, 2.0)
    dis = make_algorithm(composed("algo=grpo_dis").algo)  # math's DIS band (resolve_defaults)
    assert isinstance(dis.config, GRPODISConfig) and dis.loss == DISLoss(0.3, 5.0)
    ppo = make_algorithm(composed("algo=ppo", "algo.ttur_k=3").algo)
    assert isinstance(ppo, PPO) and ppo.config.lam == 0.95 and ppo.config.ttur_k == 3
    sao = make_algorithm(composed("algo.alpha=2.5").algo)  # the default algo is sao
    assert isinstance(sao, SAO) and sao.config.alpha == 2.5 and sao.loss == DISLoss(0.3, 5.0)


def test_defaults_in_code_are_the_yaml_ones() -> None:
    """A config built in code (no Hydra) and the composed one are the same, but for the band that
    resolve_defaults fills from the env's domain (eps None in code: the loss's own default)."""
    for name, schema in ALGO_CONFIGS.items():
        cfg = composed(f"algo={name}").algo
        code = schema()
        code.eps_low, code.eps_high = cfg.eps_low, cfg.eps_high
        assert code == cfg, name


def test_an_option_the_algorithm_lacks_is_an_error_naming_its_options() -> None:
    with pytest.raises(ConfigError, match=r"algo=grpo has no option 'ttur_k' \(its options: group_size, .*"
                                          r"scale_by_std\)"):
        algo_config("grpo", ttur_k=3)
    with pytest.raises(ConfigError, match=r"algo=grpo has no option 'scale_by_st' .*Did you mean 'scale_by_std'\?"):
        algo_config("grpo", scale_by_st=False)
    with pytest.raises(ConfigError, match=r"unknown algo 'grpp' \(known: sao, ppo, grpo, grpo_dis, reinforce_mean, sft\)\. "
                                          r"Did you mean 'grpo'\?"):
        algo_config("grpp")
    with pytest.raises(ConfigCompositionException):  # Hydra refuses it too, where the command line is not read
        composed("algo=grpo", "algo.ttur_k=3")


def test_sao_train_reads_algo_options_before_hydra() -> None:
    assert default_algo() == "sao"
    check_overrides(["algo=grpo", "algo.scale_by_std=false", "algo.group_size=8"])  # all grpo's
    check_overrides(["algo.ttur_k=3", "--cfg", "job"])  # the default algo (sao) has it
    with pytest.raises(ConfigError, match="algo=sao has no option 'scale_by_std'"):
        check_overrides(["algo.scale_by_std=false"])
    with pytest.raises(ConfigError, match="algo=ppo has no option 'alpha'"):
        check_overrides(["algo=sao,ppo", "algo.alpha=2"])  # a sweep: every algorithm of it
    check_overrides(["algo=grpoo", "algo.ttur_k=3"])  # an unknown algo: Hydra's own report
    check_overrides(["algo=choice(sao,grpo)", "algo.ttur_k=3"])  # a sweep function: Hydra reads it


def test_an_algorithm_takes_only_its_own_config() -> None:
    with pytest.raises(ConfigError, match=r"algo 'grpo' takes a GRPOConfig, got a SAOConfig"):
        make_algorithm(SAOConfig(name="grpo"))
    with pytest.raises(ConfigError, match="GRPO needs algo.group_size >= 2"):
        GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="algo=ppo needs a fixed algo.lam"):
        PPOConfig(lam=None)
    with pytest.raises(ConfigError, match="algo.ttur_k must be >= 1"):
        SAOConfig(ttur_k=0)
    with pytest.raises(ConfigError, match="algo.value_head_ridge must be > 0"):
        SAOConfig(value_head_ridge=0.0)
    with pytest.raises(ConfigError, match="algo.value_head_decay must be in"):
        SAOConfig(value_head_decay=0.0)
    with pytest.raises(ConfigError, match="algo.loss must be 'dis' or 'ppo', got 'clip'"):
        GRPOConfig(loss="clip")


def test_only_a_critic_config_sets_the_value_models_learner_options() -> None:
    grpo, sao = composed("algo=grpo"), composed("algo=sao", "algo.value_clip=0.5")
    assert not isinstance(grpo.algo, CriticAlgoConfig) and "value_clip" not in grpo.algo.learner_options()
    assert learner_config(sao).value_clip == 0.5 and learner_config(sao).freeze_value_attention is True
    assert learner_config(grpo).value_clip == 0.2  # the learner's default; GRPO has no value model
    ridge = learner_config(composed("algo=sao", "algo.value_head_ridge=1000", "algo.value_head_decay=0.9"))
    assert (ridge.value_head_ridge, ridge.value_head_decay) == (1000, 0.9) and learner_config(sao).value_head_ridge is None
