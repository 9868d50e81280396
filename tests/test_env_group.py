"""sao-train's `env` group: every registered environment is an option (sao.rl.cli.env_group)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

import sao.rl.cli.train as cli
from sao.envs import entries
from sao.rl.cli import env_group
from sao.rl.config import ConfigError


def test_every_registered_env_is_an_option():
    env_group.register_options()
    with initialize_config_module("sao.conf", version_base="1.3"):
        for name in entries():
            assert cli.to_config(compose("config", overrides=[f"env={name}"])).env.name == name
        lite = cli.to_config(compose("config", overrides=["env=swe-bench-lite"]))
    # a built-in's file wins over a generated option: swe-bench-lite shares swe-bench-verified's settings
    assert (lite.env.max_turns, lite.env.kwargs, lite.env.domain) == (300, {"max_steps": 300}, "coding")
    # a file is a registered environment's settings: named after it, or a named task over it (arithmetic-tool:
    # arithmetic with the python tool), whose `name` is the environment's
    from importlib import resources

    from omegaconf import OmegaConf

    for option in env_group.file_options():
        name = OmegaConf.load(str(resources.files("sao.conf") / "env" / f"{option}.yaml"))["name"]
        assert name in entries() and (option in entries() or name != option), option


def test_a_generated_option_holds_only_the_entrys_defaults():
    entry = entries()["swe-bench"]
    assert env_group.generated_option(entry) == {"name": "swe-bench", "kwargs": {}, "max_turns": 300,
                                                 "max_tokens": None, "max_tokens_per_turn": None}
    # an entry without budgets: its max_episode_steps as turns (else 50), no token budget
    assert env_group.generated_option(type(entry)("x", "x/X-v0", "m:f", max_episode_steps=5))["max_turns"] == 5
    assert env_group.generated_option(type(entry)("x", "x/X-v0", "m:f")) == {
        "name": "x", "kwargs": {}, "max_turns": 50, "max_tokens": None, "max_tokens_per_turn": None}


@pytest.mark.parametrize(("argv", "expected"), [
    (["env=arithmetic", "max_steps=2"], ["env=arithmetic", "max_steps=2"]),
    (["env=sao/BeyondAIME-v0"], ["env=beyond-aime"]),  # a Gymnasium id: its short name
    (["env.name=swe-local", "seed=1"], ["env=swe-local", "seed=1"]),  # the group, not arithmetic's kwargs
    (["env=arithmetic", "env.name=swe-local"], ["env=arithmetic", "env.name=swe-local"]),  # asked for
    (["-m", "env=arithmetic, swe-local"], ["-m", "env=arithmetic,swe-local"]),
    (["-m", "env=choice(arithmetic,beyond-aime)"], ["-m", "env=choice(arithmetic,beyond-aime)"]),  # Hydra's
    (["hydra.searchpath=[file://x]", "env=mine"], ["hydra.searchpath=[file://x]", "env=mine"]),  # Hydra's
    (["--cfg", "job", "algo=grpo"], ["--cfg", "job", "algo=grpo"]),
])
def test_overrides_are_rewritten_to_options(argv, expected):
    assert env_group.rewrite_overrides(argv) == expected


def test_an_unknown_env_is_a_config_error_with_a_suggestion():
    with pytest.raises(ConfigError) as err:
        env_group.rewrite_overrides(["-m", "env=arithmetic,arithmetc"])
    assert str(err.value).startswith("env=arithmetc: unknown environment 'arithmetc'. Did you mean 'arithmetic'? "
                                     "Known: arithmetic, arithmetic-tool, beyond-aime, ")
    with pytest.raises(ConfigError, match="unknown environment 'nope'"):
        env_group.rewrite_overrides(["env.name=nope"])
