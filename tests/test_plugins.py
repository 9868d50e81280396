"""Third-party environments through the `sao.envs` entry-point group, installed like a user would:
discovered, checked by `sao-env`, trained by `sao-train env=NAME`, and the docs' own example
(docs/guides/write-an-environment.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

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


class EchoLax(EchoNumber):
    """Accept any task id (breaks the contract: an unknown task must raise)."""

    gym_id = "echo/EchoLax-v0"

    def _begin(self, task_id):
        return super()._begin(None)
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
echo-lax = "sao_echo_plugin:EchoLax"
echo-broken = "sao_echo_plugin:NoSuchClass"

[tool.setuptools]
py-modules = ["sao_echo_plugin"]
'''


def install(root: Path, files: dict[str, str]) -> Path:
    """Build the distribution made of ``files`` and install it, with its dist-info (the entry points),
    into a site directory of its own under ``root`` (put on PYTHONPATH; the venv is left as it is)."""
    src, site = root / "src", root / "site"
    src.mkdir()
    for name, text in files.items():
        (src / name).write_text(text)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, timeout=300)
    return site


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """Build and install the plug-in distribution into a temporary site directory."""
    return install(tmp_path_factory.mktemp("plugin"), {"pyproject.toml": textwrap.dedent(PYPROJECT),
                                                       "sao_echo_plugin.py": textwrap.dedent(PLUGIN)})


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site)}


def _run(site: Path, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd[0]), *cmd[1:]], env=_env(site), capture_output=True, text=True,
                          timeout=timeout)


def test_plugin_is_discovered_and_conforms(plugin_site):
    code = ("import sao.envs as E, gymnasium as gym; e = E.resolve('echo-number'); "
            "E.check_env(E.make('echo-number')); print(e.gym_id, 'echo/EchoNumber-v0' in gym.registry)")
    out = subprocess.run([sys.executable, "-c", code], env=_env(plugin_site), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["echo/EchoNumber-v0", "True"]


def test_sao_env_lists_and_checks_plugins(plugin_site):
    listed = _run(plugin_site, "sao-env", "list")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line.split() for line in listed.stdout.splitlines()}
    assert lines["arithmetic"][1] == "built-in"
    assert lines["echo-number"][1:4] == ["sao-echo-plugin", "0.1.0", "echo/EchoNumber-v0"]
    assert "BROKEN:" in lines["echo-broken"] and "NoSuchClass" in " ".join(lines["echo-broken"])

    ok = _run(plugin_site, "sao-env", "check", "echo-number")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "ok: echo-number (echo/EchoNumber-v0) keeps the text-environment contract\n"
    lax = _run(plugin_site, "sao-env", "check", "echo-lax")
    assert lax.returncode == 1 and "reset with an unknown task_id did not raise" in lax.stderr, lax.stderr
    typo = _run(plugin_site, "sao-env", "check", "echo-numbr")
    assert typo.returncode == 2 and "Did you mean 'echo-number'?" in typo.stderr, typo.stderr


def _job_config(site: Path, *overrides: str) -> dict:
    out = _run(site, "sao-train", "--cfg", "job", *overrides)
    assert out.returncode == 0, out.stderr[-3000:]
    return yaml.safe_load(out.stdout)


def test_sao_train_takes_a_plugin_with_its_own_defaults(plugin_site):
    """env=NAME and env.name=NAME both give the plug-in's defaults, not arithmetic's kwargs."""
    for override in ("env=echo-number", "env.name=echo-number", "env=echo/EchoNumber-v0"):
        env = _job_config(plugin_site, override)["env"]
        assert (env["name"], env["kwargs"], env["heldout_kwargs"]) == ("echo-number", {}, None), override
    assert _job_config(plugin_site, "env=echo-number", "+env.kwargs.x=1")["env"]["kwargs"] == {"x": 1}
    assert _job_config(plugin_site, "env=arithmetic")["env"]["kwargs"]["split"] == "train"  # its file still counts


def test_sao_train_refuses_unknown_envs_with_exit_2(plugin_site):
    typo = _run(plugin_site, "sao-train", "env=echo-numbr", "max_steps=1")
    assert typo.returncode == 2
    assert typo.stderr.strip().splitlines()[-1].startswith("error: env=echo-numbr: unknown environment 'echo-numbr'. "
                                                           "Did you mean 'echo-number'? Known: arithmetic, ")
    broken = _run(plugin_site, "sao-train", "-m", "env=arithmetic,echo-broken")
    assert broken.returncode == 2 and "failed to load" in broken.stderr.splitlines()[-1], broken.stderr


# sao-train's own entry point (Hydra's multirun launcher, the env group, the run folders) with the one
# function it calls replaced by a recorder of the config each job got: no engine is started
_RECORDING_TRAINER = """
import json, sys
import sao.rl.training.build
from sao.rl.cli import train as train_cli

def run_training(config, run_dir):
    (run_dir / "env.json").write_text(json.dumps({"name": config.env.name, "kwargs": config.env.kwargs}))
    return {}

sao.rl.training.build.run_training = run_training
sys.argv = ["sao-train", *sys.argv[1:]]
train_cli.main()
"""


def test_sao_train_sweeps_over_builtin_and_plugin_envs(plugin_site, tmp_path):
    out = subprocess.run([sys.executable, "-c", _RECORDING_TRAINER, "-m", "env=arithmetic,echo-number",
                          f"output_dir={tmp_path}"], env=_env(plugin_site), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/env.json")}
    assert jobs["env=echo-number"] == {"name": "echo-number", "kwargs": {}}
    assert jobs["env=arithmetic"]["kwargs"]["ops"] == "+"


GUIDE = REPO / "docs" / "guides" / "write-an-environment.md"


def docs_example() -> dict[str, str]:
    """The files of the guide "Write an environment" (GUIDE), each the code block after its marker."""
    text = GUIDE.read_text()
    files = dict(re.findall(r"<!-- docs-example: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S))
    assert set(files) == {"my_envs.py", "pyproject.toml"}, f"{GUIDE.name}: example markers found: {sorted(files)}"
    return files


def test_the_docs_example_installs_checks_and_trains(tmp_path):
    """The guide's example environment, as written there, is a plug-in that every command takes."""
    files = docs_example()
    name = re.search(r'^([\w-]+) = "my_envs:', files["pyproject.toml"], flags=re.M).group(1)
    site = install(tmp_path, files)

    check = _run(site, "sao-env", "check", name)
    assert check.returncode == 0, check.stderr
    assert check.stdout == f"ok: {name} (my/ReverseWord-v0) keeps the text-environment contract\n"
    listed = _run(site, "sao-env", "list")
    assert [line.split()[:3] for line in listed.stdout.splitlines() if line.startswith(name)] == \
        [[name, "my-envs", "0.1.0"]], listed.stdout
    env = _job_config(site, f"env={name}")["env"]
    assert (env["name"], env["kwargs"]) == (name, {})
    short = _run(site, "sao-env", "check", name, "--env-arg", 'words=["ab", "abc"]')
    assert short.returncode == 0, short.stderr


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
