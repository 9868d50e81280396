"""What a ``sao-train`` command line says of one config group before Hydra reads it: the option it picks
(``GROUP=VALUE``, the last one wins) and the settings under it (``GROUP.KEY=VALUE``). The groups' own
checks (:mod:`sao.rl.cli.algo_group`, :mod:`sao.rl.cli.logger_group`) read them to stop a run with a line
that says what to write, where Hydra's message would not."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupOverrides:
    """``choice``: the value of the last ``GROUP=`` override (None: the command line leaves the default);
    ``settings``: each ``GROUP.KEY=VALUE`` as (key, value), the key without Hydra's ``+``/``~`` prefix."""

    choice: str | None
    settings: tuple[tuple[str, str], ...]


def group_overrides(argv: list[str], group: str) -> GroupOverrides:
    """The overrides of ``group`` in ``argv`` (Hydra's overrides; flags such as ``-m`` are skipped)."""
    choice: str | None = None
    settings: list[tuple[str, str]] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if not sep or arg.startswith("-"):
            continue
        if key == group:
            choice = value
        elif key.startswith(f"{group}."):
            settings.append((key, value))
    return GroupOverrides(choice, tuple(settings))
