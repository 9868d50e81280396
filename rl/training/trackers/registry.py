"""The trackers a run's ``logger`` selects, opened at its start (``logger=[tensorboard,wandb,mlflow]``).

Each tracker's library is imported here, before anything slow starts: a missing one is a
:class:`~sao.rl.errors.ConfigError` that names the extra to install, not a crash mid-run. Each opened
tracker is handed the resolved config at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sao.rl.config import LoggerConfig
from sao.rl.errors import ConfigError
from sao.rl.training.trackers.tracker import Tracker

# name -> (the module it needs, the extra that installs it)
NEEDS = {"tensorboard": ("tensorboard", "the core install"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def _need(name: str) -> None:
    module, extra = NEEDS[name]
    try:
        __import__(module)
    except ImportError as exc:
        how = "reinstall sao" if extra == "the core install" else f"pip install 'sao[{extra}]'"
        raise ConfigError(f"logger={name} needs the {module} package, which does not import ({exc}): {how}, "
                          f"or leave {name} out of logger=[...]") from exc


def _tensorboard(section: Any, run_dir: Path, run_name: str, resume_step: int | None) -> Tracker:
    from sao.rl.training.trackers.tensorboard import TensorBoardTracker

    log_dir = Path(section.log_dir) if section.log_dir else run_dir / "tensorboard"
    purge = resume_step + 1 if resume_step is not None else None  # the steps after the checkpoint run again
    return TensorBoardTracker(log_dir, name=run_name, purge_step=purge)


def _wandb(section: Any, run_dir: Path, run_name: str, resume_step: int | None) -> Tracker:
    from sao.rl.training.trackers.wandb import WandbTracker

    return WandbTracker(section, run_dir, name=run_name)


def _mlflow(section: Any, run_dir: Path, run_name: str, resume_step: int | None) -> Tracker:
    from sao.rl.training.trackers.mlflow import MlflowTracker

    return MlflowTracker(section, run_dir, name=run_name)


# the LoggerConfig field (the option of the logger group) -> how its tracker opens
OPENERS = {"tensorboard": _tensorboard, "wandb": _wandb, "mlflow": _mlflow}


def open_trackers(logger: LoggerConfig, run_dir: Path, config: dict[str, Any], *,
                  resume_step: int | None = None) -> list[Tracker]:
    """The selected trackers, open and holding ``config``; ``resume_step``: the checkpoint's step when the
    run resumes. The run's name is ``logger.name``, else the run folder's name."""
    run_dir = Path(run_dir)
    run_name = logger.name or run_dir.resolve().name
    opened: list[Tracker] = []
    try:
        for name, opener in OPENERS.items():
            section = getattr(logger, name)
            if section is not None:
                _need(name)
                opened.append(opener(section, run_dir, run_name, resume_step))
                opened[-1].log_config(config)
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened
