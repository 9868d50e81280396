"""``sao-train``: Hydra at the edge, typed config below it.

    sao-train max_steps=20 output_dir=runs/demo                  # SAO on arithmetic, local vLLM
    sao-train algo=grpo batch_size=16 algo.group_size=4
    sao-train -m algo=sao,grpo seed=1,2 output_dir=runs/sweep     # one folder per run: algo=sao,seed=1/ ...
    sao-train max_steps=40 output_dir=runs/demo resume=true       # continue from the last checkpoint
    sao-train env=reverse-word max_steps=2                        # any registered env, plug-ins included

Configs live in ``conf/`` (groups ``algo``, ``env``, ``model``, ``engine``, ``rollout``, ``logger``)
over the schema :class:`sao.rl.config.TrainConfig`; the ``env`` group holds every registered
environment, plug-ins included, and an unknown ``env=`` name exits 2 with a suggestion
(:mod:`sao.rl.env_group`). The run folder is ``output_dir`` (single run) or ``output_dir/<overrides>``
(multirun); Hydra's own files go to its ``.hydra/``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from sao.rl import env_group
from sao.rl.config import ConfigError, TrainConfig, resolve_defaults

log = logging.getLogger("sao.train")

_SWEEP_FUNCTIONS = ("range(", "choice(", "glob(", "interval(", "tag(")


def sweep_dirname(task_overrides: list[str], argv: list[str] | None = None) -> str:
    """A multirun job's folder name: its values of the keys the command line sweeps (``algo=sao,seed=1``),
    in command-line order. Hydra's own ``override_dirname`` names every override, sweep or not."""
    argv = sys.argv[1:] if argv is None else argv
    swept = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and not key.startswith(("-", "hydra.")) and ("," in value or value.startswith(_SWEEP_FUNCTIONS)):
            swept.append(key.lstrip("+~"))
    values = dict(o.partition("=")[::2] for o in task_overrides)
    parts = [f"{k}={values[k]}" for k in swept if k in values]
    return ",".join(parts) or "run"


if not OmegaConf.has_resolver("sao.or"):
    OmegaConf.register_new_resolver("sao.or", lambda value, default: default if value in (None, "") else value)
if not OmegaConf.has_resolver("sao.sweep_dirname"):
    OmegaConf.register_new_resolver("sao.sweep_dirname", lambda overrides: sweep_dirname(list(overrides)))
ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def to_config(cfg: DictConfig) -> TrainConfig:
    """The composed DictConfig as the typed :class:`TrainConfig` (resolving interpolations)."""
    try:
        obj = OmegaConf.to_object(cfg)
    except ValueError as exc:  # a config record's own check (__post_init__): a bad value, not a crash
        raise ConfigError(str(exc)) from exc
    assert isinstance(obj, TrainConfig)
    return resolve_defaults(obj)


@hydra.main(config_path="pkg://sao.conf", config_name="config", version_base="1.3")
def _main(cfg: DictConfig) -> float | None:
    from sao.rl.build import run_training
    from sao.rl.trainer import TrainError

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the step lines
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        config = to_config(cfg)
        config.output_dir = str(run_dir)
        last = run_training(config, run_dir)
    except (ConfigError, TrainError) as exc:
        log.error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2 if isinstance(exc, ConfigError) else 1) from None
    reward = last.get("reward/mean") if last else None
    return float(reward) if isinstance(reward, (int, float)) else None  # for sweepers that optimize


def main() -> None:
    from sao.rl.memory import configure_allocator

    configure_allocator()  # glibc's arenas and thresholds, before anything allocates (sao.rl.memory)
    try:
        sys.argv[1:] = env_group.rewrite_overrides(sys.argv[1:])  # before Hydra reads them
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    env_group.register_options()  # env=NAME for registered environments without a conf/env/NAME.yaml
    _main()


if __name__ == "__main__":
    main()
