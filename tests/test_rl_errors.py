"""rl/'s errors live in one module (sao.rl.errors), one definition each; the old import paths name the
same classes, so code that catches them keeps working."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import sao.rl.errors as errors

RL = Path(errors.__file__).parent


def _exception_classes(path: Path) -> list[str]:
    """Classes in ``path`` whose bases name an exception (``...Error``, ``Exception``, ``...Failing``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            if any(b.endswith(("Error", "Exception", "Failing")) for b in bases):
                found.append(node.name)
    return found


def test_every_rl_exception_is_defined_in_errors_py():
    elsewhere = {str(p.relative_to(RL)): names for p in sorted(RL.rglob("*.py"))
                 if p.name != "errors.py" or p.parent != RL if (names := _exception_classes(p))}
    assert elsewhere == {}, f"exceptions defined outside rl/errors.py: {elsewhere}"
    assert sorted(_exception_classes(RL / "errors.py")) == sorted(errors.__all__)


@pytest.mark.parametrize(("module", "name"), [
    ("sao.rl.config", "ConfigError"),
    ("sao.rl.rollout.schedulers", "ConfigError"),
    ("sao.rl.rollout.schedulers", "LedgerError"),
    ("sao.rl.rollout.schedulers", "RolloutError"),
    ("sao.rl.rollout.sim.simulator", "SimError"),
    ("sao.rl.rollout.failure_streak", "RolloutFailing"),
    ("sao.rl.prompts", "ScheduleError"),
    ("sao.rl.training", "TrainError"),
    ("sao.rl.training", "CheckpointError"),
    ("sao.rl.training.report", "ReportError"),
    ("sao.rl", "ConfigError"),
])
def test_old_import_paths_name_the_one_definition(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_one_config_error_for_the_training_config_and_the_schedulers():
    """A scheduler's config check and the training config's check raise the same class: one ``except``
    catches both (sao-train exits 2 on it), and it is still a ValueError."""
    from sao.rl.rollout.schedulers import SchedulerConfig

    with pytest.raises(errors.ConfigError, match="staleness must be >= 0"):
        SchedulerConfig(batch_size=4, group_size=1, staleness=-1)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.LedgerError, errors.RolloutError) and issubclass(errors.LedgerError, AssertionError)
