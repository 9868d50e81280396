"""The registered SWE environments (``sao.envs.registry``): SWE-bench from the hub or a file, and the
local tasks."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from sao.sandboxes import SandboxLimits

from ..budgets import SWE_BENCH, SWE_LOCAL
from .env import SWEBenchEnv
from .instances import HUB_SOURCES, load_instances


PAPER_MAX_STEPS = SWE_BENCH.max_steps
"""Steps per SWE-bench episode in the SAO paper's setting (METHOD.md), as the registry's budgets
declare them (:data:`sao.envs.budgets.SWE_BENCH`); ``max_steps=`` changes it."""


def _hub_env(kind: str, data: str | os.PathLike | None, split: str, kwargs: dict[str, Any]) -> SWEBenchEnv:
    source = str(data or HUB_SOURCES[kind])
    kwargs.setdefault("name", source)
    kwargs.setdefault("max_steps", PAPER_MAX_STEPS)
    return SWEBenchEnv(load_instances(source, split=split), **kwargs)


def swe_bench_verified(data: str | os.PathLike | None = None, split: str = "test", **kwargs: Any) -> SWEBenchEnv:
    """SWE-bench Verified: 500 human-validated GitHub issues (hub ``princeton-nlp/SWE-bench_Verified``, or ``data``)."""
    return _hub_env("verified", data, split, kwargs)


def swe_bench_lite(data: str | os.PathLike | None = None, split: str = "test", **kwargs: Any) -> SWEBenchEnv:
    """SWE-bench Lite: 300 self-contained issues (hub ``princeton-nlp/SWE-bench_Lite``, or ``data``)."""
    return _hub_env("lite", data, split, kwargs)


def swe_bench_full(data: str | os.PathLike | None = None, split: str = "test", **kwargs: Any) -> SWEBenchEnv:
    """SWE-bench: the full test split, 2,294 issues (hub ``princeton-nlp/SWE-bench``, or ``data``)."""
    return _hub_env("full", data, split, kwargs)


LOCAL_DIR_ENV = "SAO_SWE_LOCAL_DIR"


def local_tasks_dir() -> Path:
    """Where the local SWE tasks are built: ``$SAO_SWE_LOCAL_DIR``, else ``$XDG_CACHE_HOME/sao/swe-local``."""
    if os.environ.get(LOCAL_DIR_ENV):
        return Path(os.environ[LOCAL_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "sao" / "swe-local"


def build_local_tasks(out_dir: str | os.PathLike | None = None, **kwargs: Any) -> Path:
    """Build (or find cached) the local SWE tasks with :func:`sao.envs.swebench.local_tasks.build`."""
    from .local_tasks import build  # imported on use: `python -m sao.envs.swebench.local_tasks` runs it as __main__

    return Path(build(Path(out_dir) if out_dir else local_tasks_dir(), **kwargs))


_local_build_lock = threading.Lock()


def swe_local(data: str | os.PathLike | None = None, **kwargs: Any) -> SWEBenchEnv:
    """Six small local repositories with real bugs, in SWE-bench's schema; runs offline.

    ``data`` defaults to the builder's instances file in :func:`local_tasks_dir`; the tasks and
    their images are built there first (cached: about a second when nothing changed).
    """
    if data is None:
        with _local_build_lock:
            data = build_local_tasks()
    kwargs.setdefault("name", "swe-local")
    kwargs.setdefault("max_steps", SWE_LOCAL.max_steps)
    kwargs.setdefault("eval_timeout_s", 300.0)
    kwargs.setdefault("limits", SandboxLimits(cpus=1.0, memory_mb=1024, pids=256, network=False,
                                              output_limit_bytes=256_000,
                                              default_timeout_s=kwargs.get("command_timeout_s", 60.0)))
    kwargs.setdefault("command_timeout_s", 60.0)
    return SWEBenchEnv(load_instances(data), **kwargs)

