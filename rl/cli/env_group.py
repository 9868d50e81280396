"""The ``env`` config group of ``sao-train`` holds every registered environment.

``conf/env/NAME.yaml`` gives an environment its training settings (arithmetic's seed and splits, a
SWE env's steps). A benchmark's file takes its episode limits from the registry's budgets
(:mod:`sao.envs.budgets`) through the ``sao.budget`` resolver (``${sao.budget:${env.name},max_turns}``,
:func:`budget`), so that they are declared once; the demo tasks' files (``arithmetic``, ``swe-local``) hold
the bundled small model's sizes. A registered environment without such a file (a plug-in of the
``sao.envs`` entry-point group, say) is an option too: :func:`register_options` stores one for it in
Hydra's ConfigStore, with its name, no ``kwargs`` (the constructor's own defaults), the limits of its
budgets (:meth:`~sao.envs.registry.EnvEntry.episode_budgets`: declared, else its ``max_episode_steps``
as turns, or 50, and no token budget) and no ``heldout_kwargs`` (no held-out evaluation; the run's log
says so).

Before Hydra composes, :func:`rewrite_overrides` reads the command line: an ``env=`` value that no
environment has stops the run with a suggestion (unless ``hydra.searchpath`` adds a config folder,
whose ``env/`` options only Hydra knows), a Gymnasium id becomes its short name, and ``env.name=X``
without ``env=`` becomes ``env=X`` (else X would get the default env's kwargs).
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore

from sao.rl.errors import ConfigError

if TYPE_CHECKING:
    from sao.envs.registry import EnvEntry

# sao.envs (numpy, gymnasium, the plug-ins) is imported on first use, not with sao-train's module:
# sao-train sets glibc's allocator first (sao.rl.learner.memory)

GROUP = "env"
_NOT_PLAIN = set("()[]{}'\"$\\")  # a sweep function, a quoted value or an interpolation: Hydra reads it


def file_options() -> frozenset[str]:
    """The environments with a file of settings in ``conf/env/``."""
    folder = resources.files("sao.conf") / GROUP
    return frozenset(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


BUDGET_KEYS = ("max_turns", "max_tokens", "max_tokens_per_turn")  # what the loop takes from the env's budgets


def generated_option(entry: EnvEntry) -> dict[str, Any]:
    """The ``env`` option of an environment without a file: its name, its own defaults and budgets."""
    budgets = entry.episode_budgets()
    return {"name": entry.name, "kwargs": {}, **{key: getattr(budgets, key) for key in BUDGET_KEYS}}


def budget(name: str, key: str) -> Any:
    """One limit of an environment's budgets (``sao.budget`` resolver): ``key`` one of :data:`BUDGET_KEYS`
    or ``max_steps``."""
    from sao.envs.registry import resolve

    if key not in (*BUDGET_KEYS, "max_steps"):
        raise ConfigError(f"sao.budget: no budget {key!r}; one of {', '.join((*BUDGET_KEYS, 'max_steps'))}")
    return getattr(resolve(name).episode_budgets(), key)


def register_options() -> list[str]:
    """Store an ``env`` option for every registered environment without a file; return their names."""
    from sao.envs.registry import entries

    files = file_options()
    added = [entry for name, entry in entries().items() if name not in files]
    for entry in added:
        ConfigStore.instance().store(group=GROUP, name=entry.name, node=generated_option(entry))
    return [entry.name for entry in added]


def rewrite_overrides(argv: list[str]) -> list[str]:
    """``argv`` (Hydra's overrides) with its ``env`` choices checked and in short names (module doc).

    Raises :class:`ConfigError` for a name that is neither a file in ``conf/env/`` nor a registered
    environment, unless the command line adds a config folder (``hydra.searchpath``) that may hold it."""
    keys = [arg.partition("=")[0] for arg in argv]
    chooses_env = GROUP in keys
    lenient = any(key.lstrip("+").startswith("hydra.searchpath") for key in keys)
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and (key == GROUP or (key == f"{GROUP}.name" and not chooses_env)):
            arg = f"{GROUP}={_choices(value, lenient)}"
        out.append(arg)
    return out


def _choices(value: str, lenient: bool) -> str:
    if _NOT_PLAIN & set(value):
        return value
    return ",".join(_option(name.strip(), lenient) for name in value.split(","))


def _option(name: str, lenient: bool) -> str:
    """The ``env`` option for ``name``: a file's name, or a registered environment's short name."""
    from sao.envs.errors import UnknownEnvError
    from sao.hints import did_you_mean
    from sao.envs.registry import broken, entries, resolve

    files = file_options()
    if name in files:
        return name
    try:
        return resolve(name).name
    except UnknownEnvError:
        if lenient:
            return name  # Hydra looks for it on the search path
        why = broken().get(name)
        if why is not None:
            raise ConfigError(f"{GROUP}={name}: {why}") from None
        known = sorted(files | set(entries()))
        raise ConfigError(f"{GROUP}={name}: unknown environment {name!r}.{did_you_mean(name, known)} "
                          f"Known: {', '.join(known)}") from None
