"""The training loop with scripted parts: a tiny random Llama as the policy, the scripted HTTP
server as the engine's completions, a recording fake for its control endpoints.

What is checked here, without vLLM: every algorithm writes the contract's metric keys (null where
a key does not apply); the loop refuses to overwrite a run; a batch in which every episode failed
stops the run with the cause, after recording the episodes; and resume is exact: 2 steps + resume
to 3 ends with the same weights, optimizer moments, metrics and trajectories, bit for bit, as 3
uninterrupted steps. The real vLLM + SmolLM2 version is tests/test_train_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from sao.agents import ByteTokenizer, ChatRenderer, EpisodeRunner, LoopConfig, OpenAICompletionClient, RetryPolicy
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.rl.algos import ALGORITHMS, GRPO, PPOClipLoss, ReinforceMean, make_algorithm
from sao.rl.training.build import learner_config
from sao.rl.config import (
    AlgoConfig,
    ConfigError,
    algo_config,
    LoggerConfig,
    TrainConfig,
    scheduler_config,
    validate,
)
from sao.rl.learner.learner import Learner
from sao.rl.learner.value_model import ValueModel
from sao.rl.prompts.tasks import TaskStream
from sao.rl.rollout.orchestrated import HealthConfig, OrchestratedRollout, Replica
from sao.rl.training.metrics_log import REQUIRED_KEYS, read_jsonl, rewind_jsonl
from sao.rl.training.trainer import Trainer, TrainError
from sao.rl.weights.replica_sync import ReplicaWeightSync
from sao.rl.weights.sync import WeightSync

FAST = RetryPolicy(max_retries=1, backoff_s=0.01, max_backoff_s=0.02)
_QUESTION = re.compile(r"What is (\d+) ([-+*/]) (\d+)\?")


def _answer(prompt: str) -> int:
    a, op, b = _QUESTION.search(prompt).groups()  # type: ignore[union-attr]
    a, b = int(a), int(b)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]


def responder(request: dict, prompt: str) -> Reply:
    """Deterministic in (prompt, seed): right for two seeds in three, with seed-dependent log-probs."""
    seed = int(request.get("seed") or 0)
    value = _answer(prompt) if seed % 3 else _answer(prompt) + 1
    return Reply(text=f"The answer is \\boxed{{{value}}}.", logprob=-0.2 - 0.1 * (seed % 5))


class FakeEngine:
    """The control endpoints WeightSync and the rollout driver use, recorded."""

    root_url = "http://fake"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.cleared: list[bool] = []  # each pause's clear_cache
        self.version: str | None = "default"

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append("pause")
        self.cleared.append(clear_cache)

    async def resume(self) -> None:
        self.calls.append("resume")

    async def reload_weights(self, path: Path, *, timeout_s: float | None = None) -> None:
        assert (Path(path) / "model.safetensors").is_file()
        self.calls.append(f"reload:{Path(path).name}")

    async def set_weight_version(self, version: int | str) -> None:
        self.version = str(version)

    async def weight_version(self) -> str | None:
        return self.version

    async def reset_prefix_cache(self) -> bool:
        return True

    async def health(self) -> bool:
        return True


def tiny_policy(seed: int = 0):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=258, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def config(algo: str = "sao", **overrides) -> TrainConfig:  # type: ignore[no-untyped-def]
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train  # noqa: F401  (registers the schema and the resolver)
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        cfg = to_config(compose("config", overrides=[f"algo={algo}"]))
    cfg = replace(cfg, batch_size=4, value_pretrain_steps=1, max_steps=2, checkpoint_every=1,
                  optim=replace(cfg.optim, lr=1e-3, value_warmup_steps=0),
                  env=replace(cfg.env, kwargs={**cfg.env.kwargs, "difficulty": 0.0, "ops": "+-"}, max_tokens=48),
                  engine=replace(cfg.engine, probe=False), logger=LoggerConfig(console=False))
    if cfg.algo.group_size > 1:
        cfg = replace(cfg, algo=replace(cfg.algo, group_size=2))
    return replace(cfg, **overrides)


def sync_source(cfg: TrainConfig, run_dir: Path, client: OpenAICompletionClient, engine: FakeEngine, tasks: Any,
                health: HealthConfig = HealthConfig(), restart: Any = None, alive: Any = None) -> OrchestratedRollout:
    """``rollout=sync`` as sao-train builds it: the sync scheduler over one replica."""
    runner = EpisodeRunner("arithmetic", lambda tools: ChatRenderer(ByteTokenizer(), tools),
                           LoopConfig(max_turns=1, max_tokens=cfg.env.max_tokens, max_model_len=400), cfg.env.kwargs)

    async def play(c, ref, sample, seed):  # type: ignore[no-untyped-def]
        return await runner(c, task_id=ref.task_id, sample=sample, seed=seed)

    return OrchestratedRollout("sync", replace(scheduler_config(cfg), max_concurrency=4),
                               [Replica(client, engine, alive=alive, restart=restart)],  # type: ignore[arg-type]
                               tasks=tasks, run_episode=play, weights_root=run_dir / "weights", seed=cfg.seed,
                               health=health)


def make_trainer(cfg: TrainConfig, run_dir: Path, server: FakeServer, engine: FakeEngine, tasks: Any = None) -> Trainer:
    validate(cfg)
    algo = make_algorithm(cfg.algo)
    policy = tiny_policy()
    value = ValueModel.from_policy(policy) if algo.uses_critic else None
    learner = Learner(policy, learner_config(cfg), value_model=value)
    client = OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST)
    source = sync_source(cfg, run_dir, client, engine, tasks or TaskStream("arithmetic", cfg.env.kwargs, cfg.seed))
    sync = ReplicaWeightSync(WeightSync(engine, run_dir / "weights", model_name="fake"), source)  # type: ignore[arg-type]
    return Trainer(cfg, run_dir, learner=learner, algo=algo, source=source, weight_sync=sync, pad_id=257,
                   tasks=tasks)


def run(cfg: TrainConfig, run_dir: Path, server: FakeServer, engine: FakeEngine | None = None) -> Trainer:
    trainer = make_trainer(cfg, run_dir, server, engine or FakeEngine())
    asyncio.run(trainer.run())
    return trainer


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with FakeServer(responder=responder) as s:
        yield s


# --------------------------------------------------------------------------- config and registry


def test_every_algo_option_composes_into_its_class() -> None:
    for name in ("sao", "ppo", "grpo", "grpo_dis", "reinforce_mean"):
        cfg = config(name)
        assert cfg.algo.name == name
        assert isinstance(make_algorithm(cfg.algo), ALGORITHMS[name])
    assert config("grpo").algo.loss == "ppo" and config("grpo_dis").algo.loss == "dis"
    assert (config("grpo").algo.eps_low, config("grpo").algo.eps_high) == (0.2, 0.28)  # clip-higher
    assert config("sao").algo.lam is None and config("ppo").algo.lam == 0.95


def test_the_sync_probes_after_the_first_sync_every_probe_every_steps_and_at_the_last(tmp_path: Path,
                                                                                        server: FakeServer) -> None:
    """``engine.probe_every``: the engine/learner probe runs at version 0, at multiples of the cadence and at
    the last step; the weights are synced at every step either way."""
    seen: list[tuple[int, bool]] = []

    class Recording(WeightSync):
        async def sync(self, model, version, *, probe=True, recent=()):  # type: ignore[no-untyped-def]
            seen.append((version, probe))
            return await super().sync(model, version, probe=False, recent=recent)  # the fake engine scores nothing

    cfg = config("grpo", max_steps=5, keep_checkpoints=1, engine=replace(config().engine, probe=True, probe_every=2))
    trainer = make_trainer(cfg, tmp_path, server, FakeEngine())
    trainer.weight_sync.inner = Recording(trainer.weight_sync.inner.engine, tmp_path / "weights", model_name="fake")
    asyncio.run(trainer.run())
    assert seen == [(0, True), (1, False), (2, True), (3, False), (4, True), (5, True)]
    with pytest.raises(ConfigError, match="probe_every must be >= 1"):
        validate(replace(cfg, engine=replace(cfg.engine, probe_every=0)))


def test_bad_configs_fail_with_a_message() -> None:
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        make_algorithm(AlgoConfig(name="grpp"))
    with pytest.raises(ConfigError, match="group_size >= 2"):
        GRPO.from_config(algo_config("grpo", group_size=1, loss="ppo"))
    with pytest.raises(ConfigError, match="group_size=1"):
        ReinforceMean.from_config(algo_config("reinforce_mean", group_size=4))
    with pytest.raises(ConfigError, match="multiple of algo.group_size"):
        validate(TrainConfig(batch_size=6, algo=algo_config("grpo", group_size=4)))
    with pytest.raises(ConfigError, match="did you mean 'async'"):
        validate(TrainConfig(rollout=replace(TrainConfig().rollout, mode="asynk")))
    with pytest.raises(ConfigError, match="rollout: async_outstanding must be >= 1 batch"):
        validate(TrainConfig(rollout=replace(TrainConfig().rollout, mode="async", async_outstanding=0.5)))
    with pytest.raises(ConfigError, match="engine.base_url names 2 engine"):
        validate(TrainConfig(rollout=replace(TrainConfig().rollout, mode="async", replicas=3),
                             engine=replace(TrainConfig().engine, base_url="http://a:1,http://b:2/v1")))
    with pytest.raises(ConfigError, match="is_correction"):
        PPOClipLoss(is_correction="bogus")
    from hydra import compose, initialize_config_module
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ValidationError

    import sao.rl.cli.train  # noqa: F401

    with initialize_config_module("sao.conf", version_base="1.3"):
        with pytest.raises((ConfigCompositionException, ValidationError)):
            compose("config", overrides=["max_step=3"])  # a typo: the schema has no such key
        with pytest.raises((ConfigCompositionException, ValidationError)):
            compose("config", overrides=["batch_size=eight"])  # wrong type
        with pytest.raises(ConfigError, match="did you mean 'suffix'"):  # a record's own check: exit 2, not a traceback
            sao.rl.cli.train.to_config(compose("config", overrides=["engine.speculative=sufix"]))


def test_ppo_loss_is_taken_against_the_behaviour_policy_and_tis_is_decoupled() -> None:
    # one row, tokens 1..2 are actions; A = +1 at both
    from sao.rl.learner.batch import Batch

    logp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    batch = Batch(input_ids=torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 3, dtype=torch.long),
                  action_mask=torch.tensor([[0, 1, 1]]), rollout_logprobs=torch.tensor([[0.0, -1.0, -1.0]]),
                  rewards=torch.tensor([1.0]), truncated=torch.tensor([False]),
                  advantages=torch.tensor([[0.0, 1.0, 1.0]]))
    loss, m = PPOClipLoss()(logp, batch, agg="token-mean", normalizer=2.0)
    # against the behaviour policy: ratio_t = exp(logp - logp_rollout): token 1 exp(0) = 1, token 2 exp(-1) =
    # 0.368, below 1 - 0.2 with A = +1, so min(0.368, 0.8) is the unclipped term: loss = -(1 + 0.368) / 2,
    # d/dlogp_t = -ratio_t * A_t / N = -0.5 and -0.184
    assert loss.item() == pytest.approx(-(1.0 + 0.36788) / 2, abs=1e-4) and m["ppo/clip_frac"] == 0.0
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5, -0.36788 / 2], abs=1e-4)
    # TIS (decoupled): the ratio against the proximal policy (logp.detach()) is 1, and the weight
    # min(exp(logp_prox - logp_rollout), 2) is 1 and 0.368: the same loss here, by another route
    logp.grad = None
    loss, m = PPOClipLoss(is_correction="tis", is_cap=2.0)(logp, batch, agg="token-mean", normalizer=2.0)
    assert loss.item() == pytest.approx(-(1.0 + 0.36788) / 2, abs=1e-4)
    assert m["is/weight_mean"] == pytest.approx((1.0 + 0.36788) / 2, abs=1e-4)
    # IcePop with [0.5, 2]: token 2's 0.368 is outside -> weight 0
    _, m = PPOClipLoss(is_correction="icepop")(logp, batch, agg="token-mean", normalizer=2.0)
    assert m["is/zero_frac"] == pytest.approx(0.5)


def test_reinforce_mean_baseline_round_trips_through_state() -> None:
    algo = ReinforceMean.from_config(algo_config("reinforce_mean", baseline_window=8))
    for r in (1.0, 0.0, 1.0):
        algo.baseline.update(r)
    copy = ReinforceMean.from_config(algo_config("reinforce_mean"))
    copy.load_state_dict(json.loads(json.dumps(algo.state_dict())))  # through JSON, as the checkpoint stores it
    assert copy.baseline.baseline() == pytest.approx(2 / 3)


def test_task_stream_is_deterministic_and_resumable(tmp_path: Path) -> None:
    a = TaskStream("arithmetic", {"seed": 3}, seed=3)
    first = a.take(5) + a.take(5)
    b = TaskStream("arithmetic", {"seed": 3}, seed=3)
    b.load_state_dict(json.loads(json.dumps({**a.state_dict(), "cursor": 5})))
    assert b.take(5) == first[5:]
    assert [p.index for p in first] == list(range(10))
    # a finite dataset: every task once per epoch, a new order each epoch
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "problem": f"{i}+0?", "answer": str(i)}) + "\n" for i in range(5)))
    s = TaskStream("beyond-aime", {"data": str(data)}, seed=0)
    epoch1, epoch2 = [p.task_id for p in s.take(5)], [p.task_id for p in s.take(5)]
    assert sorted(epoch1) == sorted(epoch2) == [f"t{i}" for i in range(5)]
    with pytest.raises(ValueError, match="seed"):
        TaskStream("arithmetic", {}, seed=1).load_state_dict(a.state_dict())


# --------------------------------------------------------------------------- the loop


@pytest.mark.parametrize("algo", ["sao", "ppo", "grpo", "grpo_dis", "reinforce_mean"])
def test_every_algorithm_writes_the_contract_keys(algo: str, tmp_path: Path, server: FakeServer,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine()
    with caplog.at_level(logging.INFO, logger="sao.rl.training.trainer"):
        trainer = run(config(algo, max_steps=2, keep_checkpoints=1), tmp_path, server, engine)
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert set(REQUIRED_KEYS) <= set(r)
        assert isinstance(r["loss/policy"], float) and r["loss/policy"] == r["loss/policy"]
        assert r["engine/weight_version"] == float(r["step"]) and r["perf/sync_s"] > 0
        assert 0.0 <= r["reward/mean"] <= 1.0
        critic = ALGORITHMS[algo].uses_critic
        assert (r["loss/value"] is not None) == critic
        assert ("value/explained_var_first" in r) == critic  # a number, or null where the returns were all equal
        assert (r["dis/mask_frac"] is not None) == (config(algo).algo.loss == "dis")
    assert engine.version == "2"
    assert engine.calls.count("pause") == 3  # the initial sync (version 0) and one per step
    pretrain = tmp_path / "value_pretrain.jsonl"
    assert pretrain.exists() == ALGORITHMS[algo].uses_critic
    trajectories = lines(tmp_path / "trajectories.jsonl")
    expected = 4 * (2 + (1 if ALGORITHMS[algo].uses_critic else 0))
    assert len(trajectories) == expected
    assert {t["rollout"]["train_step"] for t in trajectories} == ({0, 1, 2} if ALGORITHMS[algo].uses_critic else {1, 2})
    # every turn is stamped with the version it was sampled with (train step s samples with s - 1)
    assert all(turn["policy_versions"] == {"first": (v := max(t["rollout"]["train_step"] - 1, 0)), "last": v}
               for t in trajectories for turn in t["turns"])
    assert trainer.state.step == 2
    # the run's end logs the critic's explained variance over the run (sao.rl.training.critic_summary)
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("critic: ")]
    assert len(summaries) == (2 if ALGORITHMS[algo].uses_critic else 0)
    assert all("second half (steps 2-2)" in m and "last 8 (steps 1-2)" in m for m in summaries)


def test_resume_is_exact(tmp_path: Path, server: FakeServer) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    a = run(config("sao", max_steps=3), straight, server)
    run(config("sao", max_steps=2), interrupted, server)
    with pytest.raises(TrainError, match="resume=true"):
        run(config("sao", max_steps=3), interrupted, server)  # not without resume=true
    b = run(config("sao", max_steps=3, resume=True), interrupted, server)

    for (name, p), q in zip(a.learner.policy.named_parameters(), b.learner.policy.parameters(), strict=True):
        assert torch.equal(p, q), name
    for p, q in zip(a.learner.value_model.parameters(), b.learner.value_model.parameters(), strict=True):
        assert torch.equal(p, q)
    sa, sb = a.learner.policy_optimizer.state_dict()["state"], b.learner.policy_optimizer.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)

    def strip(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]

    assert strip(lines(straight / "metrics.jsonl")) == strip(lines(interrupted / "metrics.jsonl"))

    def episodes(run_dir: Path) -> list[tuple]:
        return [(t["task_id"], t["seed"], tuple(t["token_ids"]), t["rollout"]["train_step"])
                for t in lines(run_dir / "trajectories.jsonl")]

    assert sorted(episodes(straight)) == sorted(episodes(interrupted))  # the same batches, none twice


def test_resume_drops_what_was_logged_after_the_checkpoint(tmp_path: Path, server: FakeServer) -> None:
    run(config("grpo", max_steps=3, checkpoint_every=2), tmp_path, server)
    # a crash after step 3's log line but before its checkpoint: simulate by removing that checkpoint
    ckpt = tmp_path / "checkpoints"
    import shutil

    shutil.rmtree(ckpt / "step_000003")
    (ckpt / "latest").write_text("step_000002\n")
    run(config("grpo", max_steps=3, checkpoint_every=2, resume=True), tmp_path, server)
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    steps = [t["rollout"]["train_step"] for t in lines(tmp_path / "trajectories.jsonl")]
    assert sorted(steps) == [1] * 4 + [2] * 4 + [3] * 4


def test_a_rollout_where_every_episode_fails_stops_with_the_cause(tmp_path: Path) -> None:
    """rollout=sync re-queues a failed attempt like every mode (rollout.max_failures times per prompt); an
    engine that fails every request stops the run once a batch's worth of prompts failed that often in
    a row, naming the cause, with every attempt recorded."""
    with (FakeServer(responder=lambda req, prompt: Reply(status=500, error="engine on fire")) as broken,
          pytest.raises(RuntimeError, match=r"the last 12 attempts all failed .*engine on fire")):
        run(config("grpo", max_steps=1), tmp_path, broken)
    recorded = lines(tmp_path / "trajectories.jsonl")
    assert len(recorded) >= 12 and all(t["status"] == "failed" and "engine on fire" in t["error"] for t in recorded)


def test_a_warmup_batch_where_every_episode_failed_stops_with_the_cause(tmp_path: Path) -> None:
    """The critic's warm-up batch runs outside the schedule: all of it failed on a live engine is the
    trainer's own error, with the batch's episodes recorded."""
    with (FakeServer(responder=lambda req, prompt: Reply(status=500, error="engine on fire")) as broken,
          pytest.raises(TrainError, match="all 4 trajectories failed")):
        run(config("sao", max_steps=1), tmp_path, broken)
    recorded = lines(tmp_path / "trajectories.jsonl")
    assert len(recorded) == 4 and all(t["status"] == "failed" and "engine on fire" in t["error"] for t in recorded)
    assert all(t["rollout"]["warmup"] for t in recorded)


def test_rewind_jsonl_keeps_earlier_steps_and_drops_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"info": {"step": 3}}\n{"step": 4')
    assert rewind_jsonl(path, 2) == 2
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_read_jsonl_skips_torn_and_foreign_lines_and_says_so_when_asked(tmp_path: Path, capsys) -> None:
    """The one reader of a run's JSON-lines files (metrics, eval, pretraining): a crash mid-write leaves a
    torn last line, which is skipped, as is a line that is not a JSON object; a missing file is no rows."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n[1, 2]\n\n{"step": 2}\n{"step": 3')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}] and capsys.readouterr().err == ""
    assert read_jsonl(path, warn=True) == [{"step": 1}, {"step": 2}]
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and f"{path}:5:" in err and f"{path}:3:" not in err  # the blank line is no record
    assert read_jsonl(tmp_path / "none.jsonl") == []
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "none.jsonl", missing_ok=False)


def test_checkpoint_round_trip_restores_rng(tmp_path: Path) -> None:
    from sao.rl.training.checkpoint import Checkpointer, TrainState

    policy = tiny_policy()
    learner = Learner(policy, learner_config(TrainConfig()), value_model=None)
    ck = Checkpointer(tmp_path, keep=1)
    torch.manual_seed(123)
    ck.save(learner, TrainState(1, 1, 0, {"x": 1}, {}))
    expected = torch.rand(3)
    torch.manual_seed(999)
    with torch.no_grad():
        policy.lm_head.weight.add_(1.0)
    state = ck.load(ck.latest(), learner)
    assert torch.equal(torch.rand(3), expected)
    assert state.source == {"x": 1} and state.step == 1
    assert torch.equal(policy.lm_head.weight, tiny_policy().lm_head.weight)  # weights back (tied head included)
    ck.save(learner, TrainState(2, 2, 0, {}, {}))
    assert [s for s, _ in ck.steps()] == [2] and (tmp_path / "latest").read_text().strip() == "step_000002"


def test_sao_report_draws_runs_and_rejects_a_folder_without_metrics(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from sao.rl.training.report import main as report, series

    for name, algo, seed in (("a", "sao", 1), ("b", "sao", 2), ("c", "grpo", 1)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "config.json").write_text(json.dumps({"algo": {"name": algo}, "seed": seed, "batch_size": 8}))
        rows = [{"step": s, "reward/mean": s / 10, "loss/policy": -0.1, "loss/value": None if algo == "grpo" else 0.2,
                 "dis/mask_frac": 0.01, "rollout/trajectories": 8.0} for s in range(1, 6)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "curves.png"
    assert report([str(tmp_path / n) for n in "abc"] + ["--out", str(out), "--x", "samples", "--label", "algo"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    printed = capsys.readouterr()
    assert printed.out == f"{out}\n" and "loss/value" in printed.err  # the path alone on stdout
    # x = trajectories seen: 8, 16, ...; null values are skipped, not drawn as 0
    assert series(lines(tmp_path / "a" / "metrics.jsonl"), "reward/mean", "samples", 8) == ([8, 16, 24, 32, 40],
                                                                                          [0.1, 0.2, 0.3, 0.4, 0.5])
    assert series(lines(tmp_path / "c" / "metrics.jsonl"), "loss/value", "step", 8) == ([], [])
    (tmp_path / "empty").mkdir()
    assert report([str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_sao_report_draws_one_run_into_it_and_refuses_to_guess_where_several_go(tmp_path: Path, capsys,
                                                                               monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from sao.rl.training.report import main as report

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s / 4}) + "\n"
                                                               for s in (1, 2)))
    monkeypatch.chdir(tmp_path)
    assert report([str(tmp_path / "a")]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'a' / 'report.png'}\n"  # into the run, its path printed
    assert (tmp_path / "a" / "report.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "report.png").exists()
    assert report([str(tmp_path / "a"), str(tmp_path / "b")]) == 2  # several: where would it go?
    assert "--out" in capsys.readouterr().err
    assert not (tmp_path / "report.png").exists() and not (tmp_path / "b" / "report.png").exists()
    assert report([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "ab.png")]) == 0
    assert (tmp_path / "ab.png").is_file()


def make_scheduled_trainer(cfg: TrainConfig, run_dir: Path, server: FakeServer) -> Trainer:
    from sao.rl.prompts.curriculum import ScheduledTaskStream

    return make_trainer(cfg, run_dir, server, FakeEngine(),
                        tasks=ScheduledTaskStream("arithmetic", cfg.env.kwargs, cfg.seed, cfg.schedule))


def test_online_schedule_moves_the_task_distribution_probes_and_resumes_exactly(tmp_path: Path,
                                                                               server: FakeServer) -> None:
    from sao.rl.config import ScheduleConfig

    # add until the last 4 rewards on add average >= 0.5, then mul; probes of every family seen, each step
    schedule = ScheduleConfig(kind="reward_gated", window=4, eval_every=1, eval_prompts=2,
                              phases=[{"families": ["add"], "advance_at": 0.5}, {"families": ["mul"]}])
    cfg = config("grpo", max_steps=3, schedule=schedule)
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    asyncio.run(make_scheduled_trainer(cfg, straight, server).run())
    rows = lines(straight / "metrics.jsonl")
    # step 1 draws add (the gate needs a full window first); the fake answers right for 2 seeds in 3,
    # so add's window clears 0.5 and step 2 draws mul
    assert rows[0]["schedule/phase"] == 0 and "reward/family/add" in rows[0] and "reward/family/mul" not in rows[0]
    assert rows[1]["schedule/phase"] == 1 and "reward/family/mul" in rows[1] and "reward/family/add" not in rows[1]
    assert "probe/family/add" in rows[1] and "probe/family/mul" in rows[1]  # both seen by then
    trajectories = lines(straight / "trajectories.jsonl")
    probes = [t for t in trajectories if t["rollout"]["probe"]]
    assert len(probes) == 2 + 4 + 4  # 2 prompts x families seen, at steps 1, 2, 3
    trained = [t for t in trajectories if not t["rollout"]["probe"]]
    assert {t["task_id"].split("-")[0] for t in trained if t["rollout"]["train_step"] >= 2} == {"mul"}

    from sao.rl.training.report import main as report, online_summary

    assert report([str(straight), "--out", str(tmp_path / "online.png")]) == 0
    shifts, forgot = online_summary(rows, pre_window=1)
    # one shift, at step 2 (add -> mul); pre-shift level = step 1's add reward
    assert [a.shift for a in shifts] == [2] and shifts[0].pre_level == rows[0]["reward/family/add"]
    assert set(forgot) == {"add"} and forgot["add"].probe == rows[2]["probe/family/add"]

    asyncio.run(make_scheduled_trainer(replace(cfg, max_steps=2), interrupted, server).run())
    asyncio.run(make_scheduled_trainer(replace(cfg, resume=True), interrupted, server).run())

    def strip(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]

    assert strip(lines(interrupted / "metrics.jsonl")) == strip(rows)
    key = lambda t: (t["task_id"], t["seed"], t["rollout"]["train_step"], bool(t["rollout"]["probe"]))  # noqa: E731
    assert sorted(map(key, lines(interrupted / "trajectories.jsonl"))) == sorted(map(key, trajectories))


def test_episodes_without_a_verdict_are_not_trained_on():
    """A reward of 0.0 from a grading that broke (info error) or could not judge (eval_error) is no reward."""
    from sao.agents.records import Trajectory
    from sao.rl.learner.trainable import failure

    def t(status="ok", **info):
        return Trajectory(episode_id="e", env="x", task_id="t", sample=0, seed=None, token_ids=(1,), action_mask=(1,),
                          logprobs=(-1.0,), turns=(), messages=(), reward=0.0, terminated=True, truncated=False,
                          status=status, error="EngineError: gone" if status != "ok" else None, info=info)

    assert failure(t(correct=False, error=None, eval_error=None)) is None
    assert "EngineError" in failure(t("failed"))
    assert "infrastructure" in failure(t(error="the grading container did not start"))
    assert "could not judge" in failure(t(eval_error="the tests cannot run in this image"))


def composed(*overrides: str) -> TrainConfig:
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train  # noqa: F401  (registers the schema and the resolver)
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        return to_config(compose("config", overrides=list(overrides)))


def test_the_token_route_is_on_where_a_sync_can_land_under_a_running_turn():
    """engine.token_route null: managed engines in the scheduled modes sample through the token route (each
    token's version); rollout=sync (no turn spans a sync) and external engines (which may lack
    --enable-scale-out) do not, unless asked."""
    assert composed().engine.token_route is False  # rollout=sync
    for mode in ("async", "multi_version", "one_step_off"):
        assert composed(f"rollout={mode}").engine.token_route is True, mode
    assert composed("rollout=pipe", "algo=grpo").engine.token_route is True
    assert composed("rollout=async", "engine.base_url=http://h:8000").engine.token_route is False
    assert composed("rollout=async", "engine.token_route=false").engine.token_route is False
    assert composed("engine.token_route=true").engine.token_route is True


def test_the_dis_band_follows_the_environments_domain():
    """METHOD.md 1.8: math 0.3 / 5.0, coding 0.8 / 3.0, chosen by the env unless the config names one."""
    sao = composed()
    assert (sao.env.domain, sao.algo.eps_low, sao.algo.eps_high) == ("math", 0.3, 5.0)
    swe = composed("env.name=swe-local")
    assert (swe.env.domain, swe.algo.eps_low, swe.algo.eps_high) == ("coding", 0.8, 3.0)
    assert composed("algo=grpo_dis", "env.name=swe-local").algo.eps_low == 0.8
    assert composed("env.name=swe-local", "algo.eps_low=0.5").algo.eps_low == 0.5  # an explicit value wins
    assert composed("algo=grpo", "env.name=swe-local").algo.eps_high == 0.28  # PPO's clip is not DIS's band
    with pytest.raises(ConfigError, match="unknown environment"):
        composed("env.name=no-such-env")


def test_the_demo_swe_task_caps_one_turns_answer_and_the_benchmarks_take_their_budgets() -> None:
    """swe-local holds the bundled model's sizes (a 256-token cap a turn); SWE-bench and the math
    benchmarks take the registry's budgets (sao.envs.budgets), sized for a real model."""
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train as cli
    from sao.envs.registry import budgets

    with initialize_config_module("sao.conf", version_base="1.3"):
        local = cli.to_config(compose("config", overrides=["env=swe-local"])).env
        assert (local.max_turns, local.max_tokens, local.max_tokens_per_turn, local.kwargs) == \
            (8, 1024, 256, {"max_steps": 8})
        for env in ("swe-bench-verified", "swe-bench-lite", "swe-bench", "beyond-aime", "imo-answerbench"):
            got, declared = cli.to_config(compose("config", overrides=[f"env={env}"])).env, budgets(env)
            assert (got.max_turns, got.max_tokens, got.max_tokens_per_turn) == \
                (declared.max_turns, declared.max_tokens, declared.max_tokens_per_turn), env
        assert cli.to_config(compose("config")).env.max_tokens_per_turn is None  # arithmetic: one turn
    with pytest.raises(ValueError, match="max_tokens_per_turn"):
        LoopConfig(max_tokens_per_turn=0)


def test_the_heldout_baseline_runs_while_the_critic_pretrains(tmp_path: Path, server: FakeServer) -> None:
    """The step-0 evaluation and the critic's pretraining both use version 0, so they run at once: the
    evaluation is held until the first pretraining update has started (in sequence it would wait
    forever), and its figures still land on the step-0 line, before step 1."""
    import threading

    from sao.rl.training.build import heldout_eval

    cfg = config("sao", max_steps=1, value_pretrain_steps=2, keep_checkpoints=1)
    cfg = replace(cfg, eval=replace(cfg.eval, enabled=True, problems=6, every=0))
    trainer = make_trainer(cfg, tmp_path, server, FakeEngine())
    client = OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST)
    inner = heldout_eval(cfg, "arithmetic", client, lambda tools: ChatRenderer(ByteTokenizer(), tools), tmp_path)
    assert inner is not None
    updating = threading.Event()  # set on the learner's thread
    pretrain = trainer.algo.pretrain_critic

    def pretrain_critic(learner, batch):  # type: ignore[no-untyped-def]
        updating.set()
        return pretrain(learner, batch)

    class Gated:
        task_ids = inner.task_ids

        async def run(self, step: int):  # type: ignore[no-untyped-def]
            for _ in range(600):  # 30 s
                if step or updating.is_set():
                    return await inner.run(step)
                await asyncio.sleep(0.05)
            raise AssertionError("the step-0 evaluation waited for a pretraining that never ran beside it")

    trainer.algo.pretrain_critic = pretrain_critic  # type: ignore[method-assign]
    trainer.heldout = Gated()  # type: ignore[assignment]
    asyncio.run(trainer.run())
    baseline, step1 = lines(tmp_path / "metrics.jsonl")
    assert baseline["step"] == 0 and baseline["eval/n"] == len(inner.task_ids) and step1["step"] == 1
    assert 0.0 <= baseline["eval/accuracy"] <= 1.0 and "eval/delta" in step1
    assert len(lines(tmp_path / "value_pretrain.jsonl")) == 2
    assert {r["step"] for r in lines(tmp_path / "eval.jsonl")} == {0, 1}
