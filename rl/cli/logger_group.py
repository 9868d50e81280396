"""The ``logger`` config group of ``sao-train``: its options are trackers, selected several at once.

``logger=[tensorboard,wandb]`` sets those trackers' sections (:class:`sao.rl.config.LoggerConfig`); the
others stay null. Hydra refuses two mistakes with messages that say neither what to write nor why: the
booleans of before (``logger.tensorboard=false``) and a tracker's setting whose tracker is not selected
(``logger.wandb.project=p`` without ``wandb`` in ``logger=[...]``). :func:`check_overrides` reads the command
line first and stops such a run with one line that says what to write.
"""

from __future__ import annotations

from sao.rl.cli.group_overrides import group_overrides
from sao.rl.errors import ConfigError

GROUP = "logger"
TRACKERS = ("tensorboard", "wandb", "mlflow")
DEFAULT = ("tensorboard",)  # conf/config.yaml's defaults list


def selected(value: str) -> list[str]:
    """The options of ``logger=VALUE``: ``[a,b]`` or a single ``a`` (``[]``: none)."""
    return [v.strip() for v in value.strip().removeprefix("[").removesuffix("]").split(",") if v.strip()]


def check_overrides(argv: list[str]) -> None:
    """Raises :class:`ConfigError` for ``logger.TRACKER=true|false`` and for ``logger.TRACKER.KEY=...`` when
    the command line (or the default, ``[tensorboard]``) does not select TRACKER."""
    given = group_overrides(argv, GROUP)
    chosen = list(DEFAULT) if given.choice is None else selected(given.choice)
    settings = [(key, value) for key, value in given.settings if key.split(".")[1] in TRACKERS]
    for key, value in settings:
        tracker = key.split(".")[1]
        if key.count(".") == 1:
            raise ConfigError(f"{key}={value}: the trackers are no longer switches; select them with "
                              f"logger=[{','.join(TRACKERS)}] (any of them; logger=[] for none)")
        if tracker not in chosen:
            with_it = ",".join([*(c for c in chosen if c != tracker), tracker])
            raise ConfigError(f"{key}={value} sets a tracker the command line does not select: add "
                              f"logger=[{with_it}]")
