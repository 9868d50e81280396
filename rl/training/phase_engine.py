"""One managed vLLM for both phases of a run with a warm start (:mod:`sao.rl.training.phases`).

Each phase is a training run of its own, and a run without ``engine.base_url`` starts and stops its own
engine: on 2 cores a start took 122 and 123 s (2026-12-06, the tool task's two phases), a fifth of the
tool task's 30-minute budget spent starting the same engine twice. When both phases would each start one
local engine (``engine.base_url`` unset, ``cluster=local``, one replica), :func:`phase_engine` starts it once,
and both phases use it as an external engine:

- it serves an untied copy of the run's initial model in ``model.engine_dtype``, written by
  ``python -m sao.rl.weights.export`` in a child process (so no torch runs on the caller's thread:
  :mod:`sao.rl.learner.torch_thread`) into ``RUN_DIR/warm_start/engine_model``, the folder phase 1 writes
  the same copy into (written once);
- each phase, like any run on an external engine, first syncs its own initial weights into it (phase 2:
  the warm-started model, or its checkpoint on a resume), so nothing of phase 1 leaks into phase 2;
- it starts as the run's own engine would (:func:`sao.rl.training.build.managed_server`: the same cores);
- its log is ``RUN_DIR/vllm.log``; it is stopped when the run ends, also on a crash.

Otherwise (an external engine given, Ray, several replicas) each phase keeps its own engines.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from sao.rl.config import TrainConfig
from sao.rl.errors import TrainError
from sao.rl.training.build import engine_count, managed_server
from sao.rl.training.phases import WARM_START
from sao.rl.training.run_folder import RunFiles


def shares_engine(cfg: TrainConfig) -> bool:
    """Whether each phase would start one local engine of its own (then :func:`phase_engine` starts one)."""
    return cfg.engine.base_url is None and cfg.cluster.kind == "local" and engine_count(cfg) == 1


def export_untied(model: str, out: Path, dtype: str) -> Path:
    """``model``'s untied ``dtype`` copy in ``out`` (kept if already there), written by a child process."""
    done = subprocess.run([sys.executable, "-m", "sao.rl.weights.export", model, str(out), "--dtype", dtype],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise TrainError(f"could not export {model} for the run's engine: {done.stderr.strip()[-2000:]}")
    return out


@contextlib.contextmanager
def phase_engine(cfg: TrainConfig, run_dir: Path) -> Iterator[TrainConfig]:
    """``cfg`` with ``engine.base_url`` and ``engine.served_name`` of one managed vLLM that lives as long as
    the context (module doc), or ``cfg`` unchanged when :func:`shares_engine` says no."""
    if not shares_engine(cfg):
        yield cfg
        return
    run_dir = Path(run_dir)
    served = cfg.engine.served_name or cfg.model.name
    model = export_untied(cfg.model.name, RunFiles(run_dir / WARM_START).engine_model,
                          cfg.model.engine_dtype)
    with managed_server(cfg, str(model), served, run_dir / "vllm.log", 0, 1) as server:
        yield replace(cfg, engine=replace(cfg.engine, base_url=server.root_url, served_name=served))
