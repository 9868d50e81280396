"""``sao-train``: Hydra at the edge, typed config below it.

    sao-train max_steps=20 output_dir=runs/demo                  # SAO on arithmetic, local vLLM
    sao-train algo=grpo batch_size=16 algo.group_size=4
    sao-train -m algo=sao,grpo seed=1,2 output_dir=runs/sweep     # one folder per run: algo=sao,seed=1/ ...
    sao-train max_steps=40 output_dir=runs/demo resume=true       # continue from the last checkpoint
    sao-train env=reverse-word max_steps=2                        # any registered env, plug-ins included
    sao-train experiment=tool-task                                # SFT warm start, then SAO (the tool task)

Configs live in ``conf/`` (groups ``algo``, ``env``, ``model``, ``engine``, ``rollout``, ``logger``,
``warm_start``, and ``experiment``: a whole recipe)
over the schema :class:`sao.rl.config.TrainConfig`; ``logger`` selects several trackers at once
(``logger=[tensorboard,wandb,mlflow]``, :mod:`sao.rl.cli.logger_group`). Each ``algo`` option composes that algorithm's own
config, and an option it lacks exits 2 naming those it has (:mod:`sao.rl.cli.algo_group`); the ``env``
group holds every registered environment, plug-ins included, and an unknown ``env=`` name exits 2 with
a suggestion (:mod:`sao.rl.cli.env_group`). The run folder is ``output_dir`` (single run) or ``output_dir/<overrides>``
(multirun); Hydra's own files go to its ``.hydra/``.

Stopping: SIGTERM (``kill PID``) or Ctrl-C stops the run at once: the episodes in flight are
cancelled, the files are closed, every managed vLLM is stopped with its whole process tree, and the
process exits 143 (130 for Ctrl-C) with one line that says how to continue. No checkpoint is written
on a signal (the learner may be half-way through an update, and a job scheduler's grace period is
short): ``resume=true`` continues from the last checkpoint (every ``checkpoint_every`` steps), and
the steps after it run again. A failed write (a full disk) or an unreadable checkpoint stops it with
one line and exit 1; the checkpoint ``latest`` names stays loadable.
"""

from __future__ import annotations

import errno
import json
import logging
import shlex
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from sao.agents.interrupts import exit_now, interrupt_exit_code, interrupt_name, sigterm_as_interrupt
from sao.rl.cli import algo_group, env_group, logger_group
from sao.rl.config import ALGO_CONFIGS, AlgoConfig, TrainConfig, resolve_defaults
from sao.rl.errors import CheckpointError, ConfigError, TrainError

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
if not OmegaConf.has_resolver("sao.budget"):  # ${sao.budget:NAME,KEY}: the env's budget (conf/env/*.yaml)
    OmegaConf.register_new_resolver("sao.budget", lambda name, key: env_group.budget(name, key))
# The schema holds the algorithms' common base; each conf/algo/NAME.yaml starts from schema/algo/NAME, that
# algorithm's own config (ALGO_CONFIGS), so algo=NAME makes the node NAME's and refuses options NAME lacks.
ConfigStore.instance().store(name="train_schema", node=TrainConfig(algo=AlgoConfig()))
for _name, _schema in ALGO_CONFIGS.items():
    ConfigStore.instance().store(group="schema/algo", name=_name, node=_schema)


def to_config(cfg: DictConfig) -> TrainConfig:
    """The composed DictConfig as the typed :class:`TrainConfig` (resolving interpolations)."""
    try:
        obj = OmegaConf.to_object(cfg)
    except ValueError as exc:  # a config record's own check (__post_init__): a bad value, not a crash
        raise ConfigError(str(exc)) from exc
    assert isinstance(obj, TrainConfig)
    return resolve_defaults(obj)


_composed = False  # set once Hydra composed a configuration and handed it to _main


@hydra.main(config_path="pkg://sao.conf", config_name="config", version_base="1.3")
def _main(cfg: DictConfig) -> float | None:
    global _composed
    _composed = True
    from sao.agents.engine.watch import EngineRestartsExhausted
    from sao.rl.training.build import run_training
    from sao.rl.training.phase_engine import phase_engine
    from sao.rl.training.phases import run_phases

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the step lines
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        config = to_config(cfg)
        config.output_dir = str(run_dir)
        # a warm start first (warm_start=...), both phases on one engine, then the run
        last = run_phases(config, run_dir, run_training, engine=phase_engine)
    except (ConfigError, TrainError, CheckpointError, EngineRestartsExhausted) as exc:
        log.error("%s", exc)
        advice = ""
        if _disk_full(exc):
            advice = f"; free space and continue with: {resume_command(run_dir)}"
        elif isinstance(exc, EngineRestartsExhausted):
            advice = f"; continue with: {resume_command(run_dir)}"
        print(f"error: {exc}{advice}", file=sys.stderr)
        raise SystemExit(2 if isinstance(exc, ConfigError) else 1) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"error: could not write {exc.filename or 'a file'} in {run_dir}: {exc.strerror}; free space and "
              f"continue with: {resume_command(run_dir)}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated): everything is stopped by now
        print(f"sao-train {interrupt_name(exc)}; its managed engines are stopped. {_last_checkpoint(run_dir)} "
              f"Continue with: {resume_command(run_dir)}", file=sys.stderr)
        exit_now(interrupt_exit_code(exc))  # without waiting for an update in hand (sao.agents.interrupts)
    reward = last.get("reward/mean") if last else None
    return float(reward) if isinstance(reward, (int, float)) else None  # for sweepers that optimize


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in ``run_dir``: this job's overrides, its folder, resume=true."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # Hydra is not running
        overrides = []
    kept = [o for o in overrides if o.partition("=")[0].lstrip("+~") not in ("output_dir", "resume")]
    return " ".join(["sao-train", *map(shlex.quote, kept), shlex.quote(f"output_dir={run_dir}"), "resume=true"])


def _disk_full(exc: BaseException) -> bool:
    return "no space left on device" in str(exc)


def _last_checkpoint(run_dir: Path) -> str:
    from sao.rl.training.checkpoint import Checkpointer
    from sao.rl.training.run_folder import RunFiles

    try:
        latest = Checkpointer(RunFiles(run_dir).checkpoints).latest()
    except CheckpointError as exc:
        return f"{exc}."
    if latest is None:
        return "No checkpoint was written yet (none is written on a signal): a resumed run starts from step 0."
    step = int(json.loads((latest / "state.json").read_text())["step"])
    return (f"No checkpoint is written on a signal: a resumed run continues from the last one, step {step} "
            f"({latest}), and runs the steps after it again.")


def main() -> None:
    from sao.rl.learner.memory import configure_allocator

    configure_allocator()  # glibc's arenas and thresholds, before anything allocates (sao.rl.learner.memory)
    try:
        sys.argv[1:] = env_group.rewrite_overrides(sys.argv[1:])  # before Hydra reads them
        algo_group.check_overrides(sys.argv[1:])  # an option the algorithm lacks: one line naming its options
        logger_group.check_overrides(sys.argv[1:])  # logger.tensorboard=false, a setting of an unselected tracker
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    env_group.register_options()  # env=NAME for registered environments without a conf/env/NAME.yaml
    with sigterm_as_interrupt():
        try:
            _main()
        except SystemExit as exc:
            # Hydra reports a command line it cannot compose (an unknown key, a value of the wrong type, an
            # unknown option) in a few lines and exits 1 before any run starts: that is bad configuration
            if exc.code == 1 and not _composed:
                raise SystemExit(2) from None
            raise
        except KeyboardInterrupt as exc:  # before or after the run itself (Hydra composing the config)
            print(f"sao-train {interrupt_name(exc)}", file=sys.stderr)
            raise SystemExit(interrupt_exit_code(exc)) from None


if __name__ == "__main__":
    main()
