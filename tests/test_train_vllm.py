"""Training for real on the CPU: SmolLM2-135M as the learner, the session's vLLM as the engine.

The runs use the shared server through ``engine.base_url`` (starting a second vLLM would cost a
minute) and the ``restore_engine`` fixture puts the prepared weights back afterwards. The learning
rate is large (1e-4) on purpose: the engine serves bf16, and a 1e-6 step moves few weights across
a bf16 rounding boundary in two steps, so "the engine's log-probs moved" would not be observable.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import engine_call, engine_probe
from sao.rl.config import TrainConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def real_config(algo: str, server, **overrides) -> TrainConfig:  # type: ignore[no-untyped-def]
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train  # noqa: F401
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        cfg = to_config(compose("config", overrides=[f"algo={algo}"]))
    cfg = replace(cfg, batch_size=4, value_pretrain_steps=1, max_steps=2, checkpoint_every=1, keep_checkpoints=2,
                  optim=replace(cfg.optim, lr=1e-4, value_warmup_steps=0),
                  env=replace(cfg.env, kwargs={**cfg.env.kwargs, "ops": "+-"}, max_tokens=64),
                  engine=replace(cfg.engine, base_url=server.root_url, served_name=server.model_name, probe_every=1),
                  logger=replace(cfg.logger, console=False, tensorboard=None), eval=replace(cfg.eval, enabled=False))
    if cfg.algo.group_size > 1:
        cfg = replace(cfg, algo=replace(cfg.algo, group_size=2))
    return replace(cfg, **overrides)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def policy_delta(checkpoint: Path, base_dir: Path) -> float:
    """Max |w_trained - w_base| over the policy's tensors."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).state_dict()
    trained = load_file(str(checkpoint / "policy.safetensors"))
    return max(float((trained[k] - base[k]).abs().max()) for k in trained)


@pytest.mark.long
@pytest.mark.part("sao-train")
def test_sao_and_grpo_two_steps_each_with_exact_resume(restore_engine, smollm2_dir: Path, tmp_path: Path) -> None:
    from sao.rl.training.build import run_training

    server = restore_engine
    base_probe = engine_probe(server)
    try:
        for algo in ("sao", "grpo"):
            run_dir = tmp_path / algo
            # GRPO: 2 prompts x 4 samples, so that a group with mixed rewards (a learning signal) is likely;
            # a batch whose groups all have equal rewards gives GRPO a zero update (checked below).
            cfg = real_config(algo, server) if algo == "sao" else replace(
                real_config(algo, server, batch_size=8), algo=replace(real_config(algo, server).algo, group_size=4))
            run_training(replace(cfg, output_dir=str(run_dir)), run_dir)
            rows = lines(run_dir / "metrics.jsonl")
            assert [r["step"] for r in rows] == [1, 2]
            for r in rows:
                assert math.isfinite(r["loss/policy"])
                assert (r["loss/value"] is not None and math.isfinite(r["loss/value"])) == (algo == "sao")
                assert r["engine/weight_version"] == r["step"]
                assert r["sync/probe_gap"] < 0.05  # the engine serves what the learner holds
                print(f"\n{algo} step {r['step']}: reward {r['reward/mean']:.3f} loss/policy {r['loss/policy']:+.4f} "
                      f"loss/value {r['loss/value']} mask {r['dis/mask_frac']} sync {r['perf/sync_s']:.2f}s "
                      f"update {r['perf/update_s']:.1f}s step {r['perf/step_s']:.1f}s")
            assert engine_call(server, lambda c: c.weight_version()) == "2"  # the version advanced
            # weights changed in the learner ...
            delta = policy_delta(run_dir / "checkpoints" / "step_000002", smollm2_dir)
            assert delta > 1e-5, delta
            if algo == "grpo":
                assert min(r["adv/zero_frac"] for r in rows) < 1.0, "no group had mixed rewards: no signal to test"
            # ... and in the engine: its log-probs on the probe moved away from the base model's
            moved = sum(abs(a - b) for a, b in zip(engine_probe(server), base_probe)) / len(base_probe)
            print(f"{algo}: max |dw| {delta:.2e}, engine probe log-probs moved {moved:.4f} (mean)")
            assert moved > 1e-3

        # Exact resume: a copy of the SAO run rewound to its step-1 checkpoint redoes step 2 on the same
        # prompts with the same seeds, from the same learner state and the same engine weights.
        original, resumed = tmp_path / "sao", tmp_path / "sao-resumed"
        shutil.copytree(original, resumed, copy_function=os.link, ignore=shutil.ignore_patterns("step_000002", "weights"))
        (resumed / "checkpoints" / "latest").write_text("step_000001\n")
        cfg = real_config("sao", server, resume=True)
        run_training(replace(cfg, output_dir=str(resumed)), resumed)

        def step2(run_dir: Path) -> list[tuple]:
            return sorted((t["task_id"], t["sample"], t["seed"], tuple(t["token_ids"]))
                          for t in lines(run_dir / "trajectories.jsonl") if t["rollout"]["train_step"] == 2)

        a, b = step2(original), step2(resumed)
        assert [x[:3] for x in a] == [x[:3] for x in b] and len(a) == 4  # the same next batch
        # The trainer's side is exact (same prompts, seeds, learner state: bit for bit in test_train.py).
        # The sampled tokens are not guaranteed to be: vLLM's CPU kernels are not batch-invariant, so
        # the same seed on the same weights can diverge when the requests are batched differently
        # (measured: 3 or 4 of 4 identical). So this is reported, not asserted.
        same_tokens = sum(x == y for x, y in zip(a, b))
        print(f"resume: {same_tokens}/4 step-2 episodes token-identical to the uninterrupted run")
        assert [r["step"] for r in lines(resumed / "metrics.jsonl")] == [1, 2]
        assert lines(resumed / "metrics.jsonl")[0] == lines(original / "metrics.jsonl")[0]  # step 1 kept as logged
        assert json.loads((resumed / "checkpoints" / "step_000002" / "state.json").read_text())["source"] == \
            json.loads((original / "checkpoints" / "step_000002" / "state.json").read_text())["source"]
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)  # checkpoints are ~3 GB per SAO step


@pytest.mark.long
@pytest.mark.part("sao-train")
def test_sao_train_cli_sweep_and_resume(restore_engine, tmp_path: Path) -> None:
    server = restore_engine
    exe = Path(sys.executable).with_name("sao-train")
    common = ["max_steps=1", "batch_size=4", "value_pretrain_steps=0", "env.max_tokens=32", "keep_checkpoints=1",
              f"engine.base_url={server.root_url}", "logger=[]", "optim.lr=1e-4", "eval.enabled=false"]
    try:
        sweep = tmp_path / "sweep"
        # two runs, not four (CI time: each is a process start, a model load and an SAO checkpoint of ~3 GB);
        # seed=3 is not swept, so the folders name the algorithm only, and every run gets seed 3
        out = subprocess.run([str(exe), "-m", "algo=sao,grpo", "seed=3", f"output_dir={sweep}", *common],
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        folders = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
        assert folders == ["algo=grpo", "algo=sao"], folders
        for name in folders:
            rows = lines(sweep / name / "metrics.jsonl")
            assert len(rows) == 1 and rows[0]["step"] == 1
            config = json.loads((sweep / name / "config.json").read_text())
            assert f"algo={config['algo']['name']}" == name and config["seed"] == 3
            assert (sweep / name / "checkpoints" / "latest").is_file()

        single = tmp_path / "single"
        first = subprocess.run([str(exe), f"output_dir={single}", "algo=reinforce_mean", *common],
                               capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stderr[-3000:]
        again = subprocess.run([str(exe), f"output_dir={single}", "algo=reinforce_mean", *common],
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 1 and "resume=true" in again.stderr  # never overwrites a run
        common[0] = "max_steps=2"
        resumed = subprocess.run([str(exe), f"output_dir={single}", "algo=reinforce_mean", "resume=true", *common],
                                 capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        rows = lines(single / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2] and rows[1]["engine/weight_version"] == 2
        assert rows[1]["loss/value"] is None and rows[1]["dis/mask_frac"] is not None

        bad = subprocess.run([str(exe), "algo=sao", "batch_size=3", "algo.group_size=2", f"output_dir={tmp_path / 'bad'}"],
                             capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and "multiple of algo.group_size" in bad.stderr
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.part("sao-train")
def test_default_sao_train_with_a_managed_engine(smollm2_dir: Path, tmp_path: Path) -> None:
    """The README's main job, shortened to 2 policy steps: `sao-train` with the default configuration
    starts its own vLLM, pretrains the critic, trains and syncs the weights into the engine twice,
    evaluates before and after, and stops the engine (its log stays in the run folder)."""
    import psutil

    exe = Path(sys.executable).with_name("sao-train")
    run_dir = tmp_path / "main"
    owner = f"test-{os.getpid()}-{time.monotonic_ns()}"  # in the environment of every process the run starts

    def vllm_pids() -> set[int]:  # this run's: other tests (another xdist worker) start engines too
        found = set()
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "vllm" in " ".join(p.info["cmdline"] or []).lower() and p.environ().get("SAO_TEST_OWNER") == owner:
                    found.add(p.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return found

    proc = None
    try:
        with (tmp_path / "out").open("w") as stdout, (tmp_path / "err").open("w") as stderr:  # no pipe to fill
            proc = subprocess.Popen([str(exe), "max_steps=2", f"output_dir={run_dir}", "batch_size=2",
                                     "value_pretrain_steps=1", "env.max_tokens=32", "engine.kv_cache_gib=1",
                                     "keep_checkpoints=1", "eval.problems=8"],
                                    stdout=stdout, stderr=stderr, env={**os.environ, "SAO_TEST_OWNER": owner})
            deadline, seen = time.monotonic() + 900, set()
            while proc.poll() is None and time.monotonic() < deadline:  # the run's engine, seen while it serves
                seen |= vllm_pids()
                time.sleep(2)
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        out = subprocess.CompletedProcess(proc.args, proc.returncode, (tmp_path / "out").read_text(),
                                          (tmp_path / "err").read_text())
        assert seen, "the run's vLLM processes were never seen (SAO_TEST_OWNER in their environment)"
        assert out.returncode == 0, out.stderr[-3000:]
        baseline, *rows = lines(run_dir / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2] and [r["engine/weight_version"] for r in rows] == [1, 2]
        assert all(math.isfinite(r["loss/value"]) and math.isfinite(r["loss/policy"]) for r in rows)
        # held-out accuracy before the first step and after the last, and their paired difference
        assert baseline["step"] == 0 and 0.0 <= baseline["eval/accuracy"] <= 1.0 and baseline["eval/n"] == 8
        last = rows[-1]
        assert 0.0 <= last["eval/accuracy"] <= 1.0 and last["eval/delta_low"] <= last["eval/delta"]
        assert last["eval/delta"] == pytest.approx(last["eval/accuracy"] - baseline["eval/accuracy"])
        assert "held-out accuracy" in out.stderr + out.stdout
        assert (run_dir / "engine_model" / "config.json").is_file()  # the untied copy the engine started from
        assert not json.loads((run_dir / "engine_model" / "config.json").read_text())["tie_word_embeddings"]
        config = json.loads((run_dir / "config.json").read_text())
        assert (config["algo"]["name"], config["env"]["name"], config["model"]["name"]) == ("sao", "arithmetic",
                                                                                          "smollm2-135m")
        assert "Application startup complete" in (run_dir / "vllm.log").read_text()
        assert len(lines(run_dir / "value_pretrain.jsonl")) == 1
        assert not vllm_pids(), f"vLLM processes left behind: {vllm_pids()}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        shutil.rmtree(tmp_path, ignore_errors=True)


# rollout=async on real engines (weights reloaded under running trajectories, staleness within k,
# nothing lost, the rollout keys on every step) is tests/faults/test_train_faults.py's
# test_async_sao_survives_a_killed_replica_and_resumes, through sao-train itself.


@pytest.mark.part("vllm-token-route")
def test_pipe_grpo_on_the_real_engine(restore_engine, tmp_path: Path) -> None:
    """rollout=pipe algo=grpo on the session's vLLM: complete groups stream to the learner, every
    trajectory is sampled by the weights it is trained at (staleness 0), nothing lost. Sampled through
    the token route (engine.token_route): every token of every turn carries the version that sampled it."""
    from sao.rl.training.build import run_training

    server = restore_engine
    cfg = real_config("grpo", server, max_steps=2, keep_checkpoints=1, batch_size=4)
    cfg = replace(cfg, rollout=replace(cfg.rollout, mode="pipe", concurrency=8),
                  engine=replace(cfg.engine, token_route=True))
    routed = server.log_path.read_text().count("POST /inference/v1/generate")  # the engine logs each request
    try:
        run_training(replace(cfg, output_dir=str(tmp_path / "pipe")), tmp_path / "pipe")
        rows = lines(tmp_path / "pipe" / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2]
        for r in rows:
            assert r["rollout/lost"] == 0 and r["rollout/batch_staleness_max"] == 0
            assert math.isfinite(r["loss/policy"]) and r["policy/parts"] == 2  # CGP: one part per complete group
        for row in lines(tmp_path / "pipe" / "batches.jsonl"):  # whole groups, sampled at the step's version
            prompts = [e["prompt_index"] for e in row["episodes"]]
            assert all(prompts.count(p) == 2 for p in prompts)
            assert {e["policy_version"] for e in row["episodes"]} == {row["step"] - 1}
        trained = [t for t in lines(tmp_path / "pipe" / "trajectories.jsonl") if t["status"] == "ok"]
        assert trained and all(turn["token_versions"] == [[t["rollout"]["policy_version"], turn["completion_len"]]]
                               for t in trained for turn in t["turns"] if turn["completion_len"])
        turns = sum(len(t["turns"]) for t in lines(tmp_path / "pipe" / "trajectories.jsonl"))
        assert server.log_path.read_text().count("POST /inference/v1/generate") - routed >= turns  # that route
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.long
@pytest.mark.part("sao-train")
def test_default_run_memory_is_bounded_and_the_engine_follows_the_learner(restore_engine, tmp_path: Path) -> None:
    """The default configuration (SAO, the default batch, learning rate, precision and micro-batching),
    6 policy steps (issue 13's minimum) on the session's vLLM, in a fresh `sao-train` process as a user runs it (no
    allocator variable: the entry point sets glibc up itself; this test removes MALLOC_ARENA_MAX from
    the child's environment). Before issue 13's fixes it was OOM-killed at step 3 (17-19 GB).

    Memory: peak RSS at most 8 GB, and flat after step 2 (at most 10% above step 2's peak).
    The engine follows the learner: after every sync, the engine's log-probs on the fixed probe and on
    the sampled tokens of the batch just trained on match the learner's master weights (fp32 engine:
    within 1e-3; with the tied LM head that vLLM never reloaded they drifted: 0.003 after one step,
    0.007 after five), and the rollout's gap and DIS's mask stay within issue 13's bounds."""
    server = restore_engine
    exe = Path(sys.executable).with_name("sao-train")
    run_dir = tmp_path / "default"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    try:
        out = subprocess.run([str(exe), f"output_dir={run_dir}", "max_steps=6", "eval.enabled=false",
                              "checkpoint_every=100", "keep_checkpoints=1", "logger=[]",
                              "engine.probe_every=1", f"engine.base_url={server.root_url}", f"engine.served_name={server.model_name}"],
                             capture_output=True, text=True, timeout=1500, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        rows = [r for r in lines(run_dir / "metrics.jsonl") if r["step"] >= 1]
        assert [r["step"] for r in rows] == list(range(1, 7))
        peaks = [r["perf/rss_gb"] for r in rows]
        for r in rows:
            print(f"\nstep {r['step']}: rss {r['perf/rss_gb']:.2f} GB, update {r['perf/update_s']:.1f} s, gap "
                  f"{r['rollout/logprob_gap']:.4f}, mask {r['dis/mask_frac']:.4f}, probe {r['sync/probe_gap_master']:.2e}"
                  f", action probe {r['sync/action_probe_gap_master']:.2e}, changed {r['sync/changed_frac']}")
        assert max(peaks) <= 8.0, peaks
        assert peaks[-1] <= 1.10 * peaks[1], peaks  # flat after step 2
        for r in rows:
            assert r["engine/weight_version"] == r["step"]
            assert r["sync/probe_gap_master"] < 1e-3 and r["sync/action_probe_gap_master"] < 1e-3, r
            assert r["rollout/logprob_gap"] <= 0.05 and r["dis/mask_frac"] <= 0.02, r
        assert all(r["sync/changed_frac"] > 0.5 for r in rows[1:])  # fp32: (nearly) every weight moves
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
