"""The ``algo`` config group of ``sao-train``: each option composes its algorithm's own config.

``conf/algo/NAME.yaml`` starts from the schema ``schema/algo/NAME`` (:data:`sao.rl.config.ALGO_CONFIGS`),
so an ``algo.<option>=`` the chosen algorithm does not have is refused by Hydra, with a message that
names neither the algorithm nor its options. Before Hydra composes, :func:`check_overrides` reads the
command line and stops such a run with one line that names the options the algorithm has.
"""

from __future__ import annotations

from importlib import resources

from omegaconf import OmegaConf

from sao.rl.cli.group_overrides import group_overrides
from sao.rl.config import ALGO_CONFIGS, algo_options, unknown_option
from sao.rl.errors import ConfigError

GROUP = "algo"
_NOT_PLAIN = set("()[]{}'\"$\\")  # a sweep function, a quoted value or an interpolation: Hydra reads it


def default_algo() -> str | None:
    """The ``algo`` option ``conf/config.yaml``'s defaults list picks."""
    config = OmegaConf.load(str(resources.files("sao.conf") / "config.yaml"))
    for entry in config.get("defaults", []):
        if isinstance(entry, str) or GROUP not in entry:
            continue
        return str(entry[GROUP])
    return None


def check_overrides(argv: list[str]) -> None:
    """Every ``algo.<option>=`` in ``argv`` (Hydra's overrides) is an option of each algorithm the
    command line picks (``algo=a``, a sweep ``algo=a,b``, or the default). Raises :class:`ConfigError`
    naming the options the algorithm has. Names no schema knows (an unknown option, a config folder
    added with ``hydra.searchpath``) and sweep functions are left to Hydra."""
    given = group_overrides(argv, GROUP)
    value = given.choice
    names = None if value is None else [] if _NOT_PLAIN & set(value) else [v.strip() for v in value.split(",")]
    options = [key.split(".")[1] for key, _ in given.settings]
    if not options:
        return
    for name in names if names is not None else [default_algo()]:
        if name not in ALGO_CONFIGS:
            continue
        known = algo_options(name)
        for option in options:
            if option not in known:
                raise ConfigError(unknown_option(name, option, known))
