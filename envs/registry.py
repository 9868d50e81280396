"""Environment names: built-ins and third-party plug-ins, registered with Gymnasium.

Every environment has a versioned Gymnasium id (``sao/BeyondAIME-v0``) and a short name for the
CLI (``beyond-aime``). Third-party packages add environments through the entry-point group
``sao.envs``; the entry point's name is the short name and its object is either an
:class:`EnvEntry` or a callable that returns a ``gymnasium.Env``::

    [project.entry-points."sao.envs"]
    countdown = "my_pkg.envs:CountdownEnv"      # gymnasium id: plugin/countdown-v0

Each entry declares its episode budgets (:class:`~sao.envs.budgets.Budgets`: steps, turns, tokens,
temperature), which ``sao-eval`` and ``sao-train`` read (:func:`budgets`). An entry without them (a
plug-in's callable, or an ``EnvEntry`` that leaves ``budgets`` None) gets
:func:`~sao.envs.budgets.default_budgets`: its ``max_episode_steps`` as turns (else 50), no token budget.

Registration with Gymnasium is idempotent; :func:`entries` performs it on first use.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import gymnasium as gym

from sao.hints import did_you_mean

from .budgets import ARITHMETIC, MATH, SWE_BENCH, SWE_LOCAL, Budgets, default_budgets
from .errors import UnknownEnvError

log = logging.getLogger(__name__)
GROUP = "sao.envs"


@dataclass(frozen=True)
class EnvEntry:
    """One environment: ``name`` for the CLI, ``gym_id`` for ``gymnasium.make``."""

    name: str
    gym_id: str
    entry_point: str | Callable[..., gym.Env]
    description: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None
    # "math" or "coding": picks the learner's defaults that differ by domain (DIS band, METHOD.md 1.8)
    domain: str = "math"
    # what an episode may spend (sao.envs.budgets); None: default_budgets(max_episode_steps)
    budgets: Budgets | None = None

    def episode_budgets(self) -> Budgets:
        """The declared budgets, or the default for an entry that declares none."""
        return self.budgets if self.budgets is not None else default_budgets(self.max_episode_steps)


BUILTINS = (
    EnvEntry("arithmetic", "sao/Arithmetic-v0", "sao.envs.arithmetic:arithmetic",
             "generated + - * / problems; seeded, endless, with a difficulty knob", budgets=ARITHMETIC),
    EnvEntry("beyond-aime", "sao/BeyondAIME-v0", "sao.envs.math_envs:beyond_aime",
             "BeyondAIME: 100 olympiad problems with integer answers", budgets=MATH),
    EnvEntry("imo-answerbench", "sao/IMO-AnswerBench-v0", "sao.envs.math_envs:imo_answerbench",
             "IMO-AnswerBench v2: 400 problems with short answers", budgets=MATH),
    EnvEntry("swe-bench-verified", "sao/SWEBench-Verified-v0", "sao.envs.swebench:swe_bench_verified",
             "SWE-bench Verified: 500 GitHub issues, fixed with bash/editor tools in Docker, graded by their tests",
             domain="coding", budgets=SWE_BENCH),
    EnvEntry("swe-bench-lite", "sao/SWEBench-Lite-v0", "sao.envs.swebench:swe_bench_lite",
             "SWE-bench Lite: 300 self-contained GitHub issues, graded by their tests in Docker",
             domain="coding", budgets=SWE_BENCH),
    EnvEntry("swe-bench", "sao/SWEBench-Full-v0", "sao.envs.swebench:swe_bench_full",
             "SWE-bench (full test split): 2,294 GitHub issues, graded by their tests in Docker",
             domain="coding", budgets=SWE_BENCH),
    EnvEntry("swe-local", "sao/SWELocal-v0", "sao.envs.swebench:swe_local",
             "6 small local repositories with real bugs in SWE-bench's schema; offline, needs Docker",
             domain="coding", budgets=SWE_LOCAL),
)


@dataclass
class _Catalog:
    entries: dict[str, EnvEntry]
    broken: dict[str, str]  # plug-in name -> why it could not be loaded


_catalog: _Catalog | None = None


def _load() -> _Catalog:
    global _catalog
    if _catalog is None:
        entries = {e.name: e for e in BUILTINS}
        broken: dict[str, str] = {}
        for ep in entry_points(group=GROUP):
            try:
                entry = _entry_from_plugin(ep.name, ep.load())
            except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the others
                broken[ep.name] = f"plug-in {ep.name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}"
                log.warning(broken[ep.name])
                continue
            if entry.name in entries:
                log.warning("plug-in %r shadows an existing environment name; ignored", ep.name)
                continue
            entries[entry.name] = entry
        for entry in entries.values():
            if entry.gym_id not in gym.registry:
                gym.register(id=entry.gym_id, entry_point=entry.entry_point, kwargs=dict(entry.kwargs),
                             max_episode_steps=entry.max_episode_steps, disable_env_checker=True)
        _catalog = _Catalog(entries, broken)
    return _catalog


def _entry_from_plugin(name: str, obj: Any) -> EnvEntry:
    if isinstance(obj, EnvEntry):
        return obj if obj.name == name else dataclasses.replace(obj, name=name)
    if callable(obj):
        doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
        return EnvEntry(name, getattr(obj, "gym_id", f"plugin/{name}-v0"), obj, doc[0] if doc else "")
    raise TypeError(f"expected an EnvEntry or a callable returning a gymnasium.Env, got {type(obj).__name__}")


def entries() -> dict[str, EnvEntry]:
    """All known environments by short name (built-ins first, then plug-ins)."""
    return dict(_load().entries)


def broken() -> dict[str, str]:
    """The plug-ins that failed to load, by entry-point name, with why (they are not in :func:`entries`)."""
    return dict(_load().broken)


def resolve(name: str) -> EnvEntry:
    """Find an environment by short name or Gymnasium id."""
    catalog = _load()
    if name in catalog.entries:
        return catalog.entries[name]
    for entry in catalog.entries.values():
        if entry.gym_id == name:
            return entry
    if name in catalog.broken:
        raise UnknownEnvError(catalog.broken[name])
    known = sorted(catalog.entries) + sorted(e.gym_id for e in catalog.entries.values())
    raise UnknownEnvError(f"unknown environment {name!r}.{did_you_mean(name, known)} Known: {', '.join(sorted(catalog.entries))}")


def budgets(name: str) -> Budgets:
    """The episode budgets of an environment, by short name or id (the module doc's default for an
    entry that declares none)."""
    return resolve(name).episode_budgets()


def make(name: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` by short name or id. Our own ``check_env`` replaces Gymnasium's checker."""
    return gym.make(resolve(name).gym_id, disable_env_checker=True, **kwargs)


def reload_plugins() -> None:
    """Forget the catalogue so that the next call re-reads the entry points (after installing a plug-in)."""
    global _catalog
    _catalog = None
