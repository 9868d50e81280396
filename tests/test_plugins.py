"""Third-party environments through the `sao.envs` entry-point group, installed like a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN = '''
from sao.envs import TextEnv


class EchoNumber(TextEnv):
    """Say the number back."""

    gym_id = "echo/EchoNumber-v0"

    def task_ids(self, limit=None):
        return [f"n{i}" for i in range(10)][:limit]

    def _begin(self, task_id):
        if task_id is None:
            task_id = f"n{int(self.np_random.integers(10))}"
        if task_id not in self.task_ids():
            raise KeyError(f"no task {task_id!r}")
        self.n = int(task_id[1:])
        return [{"role": "user", "content": f"Reply with the number {self.n} and nothing else."}], {"task_id": task_id}

    def _respond(self, action):
        correct = str(self.n) in (action.get("content") or "")
        return [], float(correct), True, False, {"correct": correct, "answer": action.get("content"), "error": None}
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "sao-echo-plugin"
version = "0.1.0"

[project.entry-points."sao.envs"]
echo-number = "sao_echo_plugin:EchoNumber"

[tool.setuptools]
py-modules = ["sao_echo_plugin"]
'''


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """Build and install the plug-in distribution into a temporary site directory."""
    root = tmp_path_factory.mktemp("plugin")
    src, site = root / "src", root / "site"
    src.mkdir()
    (src / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (src / "sao_echo_plugin.py").write_text(textwrap.dedent(PLUGIN))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, timeout=300)
    return site


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site)}


def test_plugin_is_discovered_and_conforms(plugin_site):
    code = ("import sao.envs as E, gymnasium as gym; e = E.resolve('echo-number'); "
            "E.check_env(E.make('echo-number')); print(e.gym_id, 'echo/EchoNumber-v0' in gym.registry)")
    out = subprocess.run([sys.executable, "-c", code], env=_env(plugin_site), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["echo/EchoNumber-v0", "True"]


@pytest.mark.vllm
def test_sao_eval_runs_the_plugin(plugin_site, vllm_server, tmp_path):
    out = tmp_path / "echo"
    proc = subprocess.run([str(Path(sys.executable).with_name("sao-eval")), "echo-number", "--limit", "3",
                           "--max-tokens", "16", "--base-url", vllm_server.base_url, "--model",
                           vllm_server.model_name, "--output", str(out)],
                          env=_env(plugin_site), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["benchmark"] == "echo-number" and summary["n_tasks"] == 3
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
