"""Experiment trackers (sao.rl.training.trackers): the ``logger`` group selects several at once; the trainer
hands each one every step's scalars and each held-out evaluation's episodes; the real TensorBoard, W&B
(offline) and MLflow (a SQLite store) hold what was logged, read back with their own readers
(tests/tracker_stores.py); a tracker whose library is missing fails at the start naming its extra."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sao.agents import ByteTokenizer, ChatRenderer, OpenAICompletionClient
from sao.agents.records import Trajectory
from sao.agents.testing.fake_server import FakeServer
from sao.rl.config import LoggerConfig, MlflowConfig, TensorBoardConfig, WandbConfig
from sao.rl.errors import ConfigError
from sao.rl.training.trackers import TrackerSink, flatten, open_trackers
from tests import tracker_stores as stores
from tests.test_train import FAST, FakeEngine, config, lines, make_trainer, responder


def composed_logger(*overrides: str) -> LoggerConfig:
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train  # noqa: F401  (registers the schema)
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        return to_config(compose("config", overrides=list(overrides))).logger


def test_the_logger_group_selects_several_trackers_at_once() -> None:
    default = composed_logger()
    assert default.tensorboard == TensorBoardConfig() and default.wandb is None and default.mlflow is None
    assert default.console and default.jsonl and default.save_trajectories
    none = composed_logger("logger=[]")
    assert (none.tensorboard, none.wandb, none.mlflow) == (None, None, None) and none.console
    every = composed_logger("logger=[tensorboard,wandb,mlflow]", "logger.wandb.project=p", "logger.name=n")
    assert every.tensorboard == TensorBoardConfig() and every.mlflow == MlflowConfig() and every.name == "n"
    assert every.wandb == WandbConfig(project="p")
    quiet = composed_logger("logger=quiet")  # the old quiet: no console, no tracker
    assert not quiet.console and quiet.tensorboard is None and quiet.jsonl
    assert composed_logger("logger=[quiet,mlflow]").mlflow == MlflowConfig()


class FakeTracker:
    def __init__(self) -> None:
        self.config: dict[str, Any] | None = None
        self.scalars: dict[int, dict[str, float]] = {}
        self.samples: dict[int, list[Trajectory]] = {}
        self.closed = 0

    def log_config(self, config: dict[str, Any]) -> None:
        self.config = config

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.scalars.setdefault(step, {}).update(scalars)

    def log_samples(self, step: int, trajectories: Any) -> None:
        self.samples[step] = list(trajectories)

    def close(self) -> None:
        self.closed += 1


def test_the_trainer_hands_trackers_each_steps_scalars_and_each_evaluations_episodes(tmp_path: Path) -> None:
    from sao.rl.training.build import heldout_eval

    cfg = config("grpo", max_steps=2, keep_checkpoints=1)
    cfg = replace(cfg, eval=replace(cfg.eval, enabled=True, problems=4, every=1))
    with FakeServer(responder=responder) as server:
        trainer = make_trainer(cfg, tmp_path, server, FakeEngine())
        client = OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST)
        trainer.heldout = heldout_eval(cfg, "arithmetic", client, lambda tools: ChatRenderer(ByteTokenizer(), tools),
                                       tmp_path)
        a, b = FakeTracker(), FakeTracker()
        trainer.trackers = [a, b]
        asyncio.run(trainer.run())
    rows = {r["step"]: r for r in lines(tmp_path / "metrics.jsonl")}
    for tracker in (a, b):
        assert sorted(tracker.scalars) == [0, 1, 2] and tracker.closed == 1
        # the same numbers as metrics.jsonl, without its nulls (a tracker takes finite numbers only)
        for step, row in rows.items():
            expected = {k: float(v) for k, v in row.items()
                        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
            assert tracker.scalars[step] == expected
        assert "loss/value" not in tracker.scalars[1]  # grpo: null in metrics.jsonl, absent here
        assert sorted(tracker.samples) == [0, 1, 2]  # before step 1, and after each step (every=1)
        assert [t.task_id for t in tracker.samples[2]] == list(trainer.heldout.task_ids)


def test_tracker_sink_keeps_finite_numbers_and_flatten_dots_the_config() -> None:
    t = FakeTracker()
    sink = TrackerSink([t])
    sink.log(3, {"a": 1, "b": float("nan"), "c": None, "d": True, "e": "x", "f": 2.5})
    assert t.scalars == {3: {"a": 1.0, "f": 2.5}}
    sink.close()
    assert t.closed == 1
    assert flatten({"algo": {"name": "sao", "lam": None}, "tags": [1, 2], "lr": 1e-3}) == {
        "algo.name": "sao", "algo.lam": "null", "tags": "[1, 2]", "lr": 1e-3}


def sample(task_id: str, answer: str, reward: float) -> Trajectory:
    return Trajectory(episode_id="e", env="arithmetic", task_id=task_id, sample=0, seed=0, token_ids=(1,),
                      action_mask=(1,), logprobs=(-1.0,), turns=(),
                      messages=({"role": "user", "content": "2+2?"}, {"role": "assistant", "content": answer}),
                      reward=reward, terminated=True, truncated=False, status="ok", info={"correct": reward > 0})


@pytest.mark.part("trackers")
def test_each_real_tracker_stores_the_scalars_the_config_and_the_name(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb is an optional extra: pip install -e '.[wandb]'")
    pytest.importorskip("mlflow", reason="mlflow is an optional extra: pip install -e '.[mlflow]'")
    for name in ("WANDB_DIR", "WANDB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "my-run"
    logger = LoggerConfig(tensorboard=TensorBoardConfig(), wandb=WandbConfig(mode="offline", samples=1),
                          mlflow=MlflowConfig())
    config = {"algo": {"name": "sao", "lam": None}, "optim": {"lr": 3e-5}, "max_steps": 2}
    trackers = open_trackers(logger, run_dir, config)
    sink = TrackerSink(trackers)
    sink.log(1, {"loss/policy": 0.5, "reward/mean": 0.25, "loss/value": None})
    for tracker in trackers:
        tracker.log_samples(2, [sample("add-1", "4", 1.0), sample("add-2", "5", 0.0)])
    sink.log(2, {"loss/policy": 0.25, "reward/mean": 0.75, "loss/value": None})
    sink.close()
    sink.close()  # twice: nothing more

    expected = {"loss/policy": {1: 0.5, 2: 0.25}, "reward/mean": {1: 0.25, 2: 0.75}}
    assert stores.tensorboard_scalars(run_dir / "tensorboard") == expected
    hparams = stores.tensorboard_hparams(run_dir / "tensorboard")
    assert hparams["algo.name"] == "sao" and hparams["optim.lr"] == pytest.approx(3e-5) and hparams["run_name"] == "my-run"

    wandb_run = stores.wandb_offline_run(run_dir / "wandb")
    assert wandb_run["name"] == "my-run" and stores.wandb_scalars(wandb_run) == expected
    assert stores.wandb_config_value(wandb_run["config"], "algo.name") == "sao"
    assert stores.wandb_config_value(wandb_run["config"], "optim.lr") == pytest.approx(3e-5)
    (step, table), = wandb_run["tables"]["eval/samples"]  # logger.wandb.samples=1: the first episode
    assert step == 2 and table["columns"][:2] == ["step", "task_id"]
    assert [row[1] for row in table["data"]] == ["add-1"] and table["data"][0][5:7] == ["2+2?", "4"]

    mlflow_run = stores.mlflow_run(f"sqlite:///{run_dir.resolve()}/mlflow.db")
    assert mlflow_run["name"] == "my-run" and mlflow_run["status"] == "FINISHED"
    assert mlflow_run["metrics"] == expected
    assert mlflow_run["params"]["algo.name"] == "sao" and mlflow_run["params"]["algo.lam"] == "null"
    assert float(mlflow_run["params"]["optim.lr"]) == pytest.approx(3e-5)


def test_a_tracker_whose_library_is_missing_fails_at_the_start_naming_its_extra(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    opened = FakeTracker()
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    monkeypatch.setattr("sao.rl.training.trackers.registry.OPENERS",
                        {"tensorboard": lambda *a: opened, "wandb": lambda *a: opened,
                         "mlflow": lambda *a: pytest.fail("opened without its library")})
    with pytest.raises(ConfigError, match=r"logger=mlflow needs the mlflow package.*pip install 'sao\[mlflow\]'"):
        open_trackers(LoggerConfig(tensorboard=TensorBoardConfig(), mlflow=MlflowConfig()), tmp_path, {})
    assert opened.closed == 1  # the tracker opened before it is closed again


def test_sao_train_says_what_to_write_for_the_old_switches_and_an_unselected_trackers_setting() -> None:
    from sao.rl.cli.logger_group import check_overrides

    with pytest.raises(ConfigError, match=r"no longer switches.*logger=\[tensorboard,wandb,mlflow\]"):
        check_overrides(["max_steps=2", "logger.tensorboard=false"])
    with pytest.raises(ConfigError, match=r"logger.wandb.project=p sets a tracker .* add logger=\[tensorboard,wandb\]"):
        check_overrides(["logger.wandb.project=p"])  # the default selects tensorboard only
    with pytest.raises(ConfigError, match=r"add logger=\[mlflow\]"):
        check_overrides(["logger=[]", "logger.mlflow.experiment=e"])
    check_overrides(["logger=[wandb,mlflow]", "logger.wandb.project=p", "logger.mlflow.experiment=e"])
    check_overrides(["logger=wandb", "logger.wandb.mode=offline", "logger.console=false", "logger.name=n"])
    check_overrides(["logger.tensorboard.log_dir=/tmp/tb"])  # selected by default
