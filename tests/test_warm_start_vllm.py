"""The warm start for real: SmolLM2-135M learns from the scripted demonstrations of the tool task, with the
session's vLLM serving its held-out evaluation (real tool calls parsed from the real model's text, run in
the sandbox). A few steps, a handful of demonstrations: the run ends by its step budget or its stop rule,
with a curve and a best model that a later run loads (tests/test_warm_start.py checks the rules with fakes)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.long
@pytest.mark.part("sao-train")
def test_sft_on_the_tool_task_with_a_real_engine_writes_its_curve_and_best_model(restore_engine, smollm2_dir: Path,
                                                                                tmp_path: Path) -> None:
    from hydra import compose, initialize_config_module
    from transformers import AutoModelForCausalLM

    import sao.rl.cli.train  # noqa: F401
    from sao.rl.cli.train import to_config
    from sao.rl.training.build import run_training

    server = restore_engine
    overrides = ["algo=sft", "env=arithmetic-tool", "max_steps=3", "batch_size=4", "optim.lr=1e-4",
                 "eval.every=1", "eval.patience=2", "eval.problems=8", "checkpoint_every=3",
                 f"engine.base_url={server.root_url}", f"engine.served_name={server.model_name}",
                 "logger=[]", "logger.console=false"]
    with initialize_config_module("sao.conf", version_base="1.3"):
        cfg = to_config(compose("config", overrides=overrides))
    run_dir = tmp_path / "sft"
    run_training(replace(cfg, output_dir=str(run_dir)), run_dir)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps[0] == 0 and 2 <= len(steps) <= 4
    trained = [r for r in rows if r["step"] > 0]
    assert all(r["sft/nll"] > 0 and r["reward/mean"] == 1.0 and r["rollout/turns_mean"] == 2.0 for r in trained)
    assert trained[-1]["sft/nll"] < trained[0]["sft/nll"]  # the demonstrations' tokens grow likelier
    curve = json.loads((run_dir / "curve.json").read_text())
    assert [p["step"] for p in curve["curve"]] == steps and all(0 <= p["accuracy"] <= 1 for p in curve["curve"])
    demos = [json.loads(x) for x in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert all(d["task_id"].endswith("-train") and d["reward"] == 1.0 for d in demos)
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert all(e["task_id"].endswith("-test") and e["status"] == "ok" for e in evals)
    model = AutoModelForCausalLM.from_pretrained(run_dir / "best_model")  # the hand-over: model.name=best_model
    assert model.config.vocab_size == 49152 and (run_dir / "best_model" / "tokenizer.json").exists()
