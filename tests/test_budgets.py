"""Episode budgets (sao.envs.budgets): one declaration per benchmark, read by sao-eval, sao-train and the
environments; a loop without a token budget is bounded by the context only. No engine is started."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import sao.envs as E
from sao.agents import ByteTokenizer, ChatRenderer, LoopConfig, OpenAICompletionClient, RetryPolicy, run_episode
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.envs.budgets import Budgets, default_budgets
from sao.envs.registry import BUILTINS, EnvEntry, budgets, entries
from sao.evals.cli import build_parser, eval_config
from sao.evals.runner import EvalConfig, evaluate

FAST = RetryPolicy(max_retries=3, backoff_s=0.01, max_backoff_s=0.02)
FLAGS = ("--max-steps", "--max-turns", "--max-tokens", "--max-tokens-per-turn", "--temperature", "--max-model-len")


def cli_config(tmp_path: Path, *argv: str) -> EvalConfig:
    return eval_config(build_parser().parse_args([*argv, "--concurrency", "1"]), tmp_path / "out")


def test_every_builtin_declares_the_budgets_the_paper_and_the_tasks_give():
    assert all(entry.budgets is not None for entry in BUILTINS)
    swe = Budgets(max_steps=300, max_turns=300, max_tokens=None, max_tokens_per_turn=None, temperature=1.0)
    for name in ("swe-bench-verified", "swe-bench-lite", "swe-bench"):
        assert budgets(name) == swe, name
    for name in ("beyond-aime", "imo-answerbench"):
        assert budgets(name) == Budgets(max_turns=50, temperature=1.0), name
    assert budgets("swe-local") == Budgets(max_steps=50, max_turns=50)
    assert budgets("arithmetic") == Budgets(max_turns=1)
    assert budgets("sao/SWEBench-Verified-v0") == swe  # a Gymnasium id too


def test_the_environments_take_their_step_limit_from_the_same_record(tmp_path):
    from sao.envs.swebench import factories

    assert factories.PAPER_MAX_STEPS == budgets("swe-bench-verified").max_steps == 300
    made = E.make("swe-local").unwrapped  # builds the local tasks' files (cached); no container
    try:
        assert made.max_steps == budgets("swe-local").max_steps
    finally:
        made.close()


def test_an_entry_without_budgets_gets_the_documented_default():
    assert EnvEntry("x", "x/X-v0", "m:f", max_episode_steps=7).episode_budgets() == Budgets(max_turns=7)
    assert EnvEntry("x", "x/X-v0", "m:f").episode_budgets() == default_budgets(None) == Budgets(max_turns=50)
    with pytest.raises(ValueError, match="max_turns"):
        Budgets(max_turns=0)
    with pytest.raises(ValueError, match="max_tokens"):
        Budgets(max_turns=1, max_tokens=0)


def test_the_budget_flags_default_to_none_and_resolve_to_the_benchmarks_budgets(tmp_path):
    parser = build_parser()
    for flag in FLAGS:
        assert parser.get_default(flag.lstrip("-").replace("-", "_")) is None, flag
    for name in entries():
        declared = budgets(name)
        cfg = cli_config(tmp_path, name)
        assert (cfg.max_turns, cfg.max_tokens, cfg.max_tokens_per_turn, cfg.temperature) == \
            (declared.max_turns, declared.max_tokens, declared.max_tokens_per_turn, declared.temperature), name
        assert cfg.budgets() == {"max_steps": declared.max_steps, "max_turns": declared.max_turns,
                                 "max_tokens": declared.max_tokens, "max_tokens_per_turn": declared.max_tokens_per_turn,
                                 "temperature": declared.temperature}, name
        assert cfg.max_model_len is None and "max_steps" not in cfg.env_args  # the model's context; the env's own
    verified = cli_config(tmp_path, "swe-bench-verified")
    assert (verified.max_turns, verified.max_tokens, verified.budgets()["max_steps"]) == (300, None, 300)


def test_an_explicit_flag_overrides_its_one_value(tmp_path):
    cfg = cli_config(tmp_path, "swe-bench-verified", "--max-turns", "40", "--max-tokens", "1024",
                     "--max-tokens-per-turn", "256", "--max-steps", "30", "--temperature", "0.5",
                     "--max-model-len", "4096")
    assert (cfg.max_turns, cfg.max_tokens, cfg.max_tokens_per_turn, cfg.temperature, cfg.max_model_len) == \
        (40, 1024, 256, 0.5, 4096)
    assert cfg.env_args == {"max_steps": 30} and cfg.budgets()["max_steps"] == 30
    only_turns = cli_config(tmp_path, "beyond-aime", "--max-turns", "3")
    assert (only_turns.max_turns, only_turns.max_tokens, only_turns.temperature) == (3, None, 1.0)
    with pytest.raises(Exception, match="--max-tokens must be >= 1"):
        cli_config(tmp_path, "arithmetic", "--max-tokens", "0")


def test_help_shows_each_benchmarks_budgets():
    text = build_parser().format_help()
    assert "swe-bench-verified: 300 steps, 300 turns, no token budget, temperature 1.0" in text
    assert "beyond-aime: 50 turns, no token budget, temperature 1.0" in text
    assert "arithmetic: 1 turn, no token budget" in text
    for name in entries():
        assert f"  {name}: {budgets(name).describe()}" in text, name


def test_summary_and_run_json_record_the_budgets_used(tmp_path):
    summary = evaluate(EvalConfig("arithmetic", tmp_path / "gold", agent="gold", limit=2))
    used = {"max_steps": None, "max_turns": 1, "max_tokens": None, "max_tokens_per_turn": None, "temperature": 1.0}
    assert summary["budgets"] == used and "max_model_len" not in summary  # no model played
    assert json.loads((tmp_path / "gold" / "run.json").read_text())["budgets"] == used

    def right(request: dict, prompt: str) -> Reply:
        return Reply(text="\\boxed{0}")

    with FakeServer(responder=right, chat_only=True) as server:
        summary = evaluate(EvalConfig("beyond-aime", tmp_path / "chat", data=str(_beyond_aime(tmp_path)),
                                      base_url=server.base_url, model="org/hosted", endpoint_mode="chat", limit=2,
                                      max_tokens=500, max_model_len=3000, timeout_s=10.0))
        assert all("max_tokens" in r for r in server.requests)
    assert summary["budgets"] == {"max_steps": None, "max_turns": 50, "max_tokens": 500, "max_tokens_per_turn": None,
                                  "temperature": 1.0}
    assert summary["max_model_len"] == 3000  # the server reports none: the flag's


def _beyond_aime(tmp_path: Path) -> Path:
    rows = [{"problem": f"What is {i} times zero?", "answer": "0"} for i in range(3)]
    path = tmp_path / "beyond_aime.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_without_a_token_budget_only_the_context_bounds_the_episode():
    """LoopConfig(max_tokens=None): each turn may take what the context has left; the episode ends when
    the context is full, after far more than the old 1,024-token default."""
    context = 3000

    async def go(server):
        client = OpenAICompletionClient(server.base_url, "fake", timeout_s=5.0, retry=FAST)
        try:
            env = E.make("arithmetic", feedback_turns=10)
            return await run_episode(env, client, ChatRenderer(ByteTokenizer()),
                                     LoopConfig(max_tokens=None, max_turns=10, max_model_len=context),
                                     env_name="arithmetic", task_id="mul-d1-s0-i0", seed=7)
        finally:
            await client.aclose()

    with FakeServer(responder=lambda request, prompt: Reply(text="no " * 400)) as server:  # 1,200 tokens, wrong
        t = asyncio.run(go(server))
        requests = server.requests
    assert t.status == "ok" and t.truncated and t.info["truncated_by"] == "context"
    assert t.num_action_tokens > 1024 and len(t.turns) >= 3
    for request in requests:  # the room of each turn: the context left, nothing else
        assert request["max_tokens"] == context - len(request["prompt"])
    assert all(turn.prompt_len + turn.completion_len <= context for turn in t.turns)
    with pytest.raises(ValueError, match="max_tokens must be >= 1 or None"):
        LoopConfig(max_tokens=0)


def test_a_chat_request_without_a_budget_names_no_max_tokens():
    from sao.agents import OpenAIChatClient, run_text_episode

    async def go(server):
        client = OpenAIChatClient(server.base_url, "fake", timeout_s=5.0, retry=FAST)
        try:
            return await run_text_episode(E.make("arithmetic"), client, LoopConfig(max_tokens=None), env_name="arithmetic",
                                          task_id="mul-d1-s0-i0", seed=7)
        finally:
            await client.aclose()

    with FakeServer([Reply(text="x " * 2000 + "\\boxed{0}")], chat_only=True) as server:
        t = asyncio.run(go(server))
        (request,) = server.requests
    assert "max_tokens" not in request and t.status == "ok" and not t.truncated  # the server's context bounds it


def test_a_managed_engine_takes_the_models_own_context(tmp_path):
    from sao.agents.clients.endpoint import model_context, open_endpoint, served_context
    from sao.agents.engine.server import VLLMServerConfig

    assert "--max-model-len" not in VLLMServerConfig(model="m", max_model_len=None).command(1)
    cmd = VLLMServerConfig(model="m", max_model_len=4096).command(1)
    assert cmd[cmd.index("--max-model-len") + 1] == "4096"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 12288}))
    assert model_context(str(model)) == 12288 and model_context(str(tmp_path)) is None
    with FakeServer() as server:  # reports no max_model_len in /v1/models: the model's config.json
        assert served_context(server.base_url, "fake", str(model)) == 12288
        with open_endpoint(str(model), base_url=server.base_url, mode="tokens") as endpoint:
            assert endpoint.max_model_len == 12288
        with open_endpoint(str(model), base_url=server.base_url, mode="tokens", max_model_len=777) as endpoint:
            assert endpoint.max_model_len == 777


# sao-train's main job (no overrides: env=arithmetic) as composed before the budgets moved to the registry:
# the episode sizes and the engine that the demo depends on, recorded from `sao-train --cfg job --resolve`
MAIN_JOB_ENV = {"name": "arithmetic", "kwargs": {"seed": 0, "difficulty": 0.5, "ops": "+", "max_digits": 2,
                                                 "split": "train"},
                "max_turns": 1, "max_tokens": 128, "max_tokens_per_turn": None, "domain": None,
                "max_concurrent": None, "heldout_kwargs": {"split": "test"}}
MAIN_JOB = {"max_steps": 16, "batch_size": 8, "seed": 0, "engine.max_model_len": 2048, "model.name": "smollm2-135m",
            "rollout.temperature": 1.0, "rollout.top_p": 1.0, "eval.max_tokens": None, "eval.temperature": 0.0,
            "eval.problems": 200, "algo.name": "sao"}
SWE_LOCAL_ENV = {"name": "swe-local", "kwargs": {"max_steps": 8}, "max_turns": 8, "max_tokens": 1024,
                 "max_tokens_per_turn": 256, "domain": None, "max_concurrent": None, "heldout_kwargs": None}


def _job(*overrides: str) -> dict:
    """``sao-train --cfg job --resolve OVERRIDES`` as plain data (Hydra's compose API, as the docs hook does)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    import sao.rl.cli.train  # noqa: F401 - the schema and the resolvers

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="sao.conf", version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="config", overrides=list(overrides)), resolve=True)


def test_sao_trains_main_job_and_the_demo_swe_task_keep_their_sizes():
    for overrides in ((), ("env=arithmetic",)):
        job = _job(*overrides)
        assert job["env"] == MAIN_JOB_ENV, overrides
        for key, value in MAIN_JOB.items():
            node = job
            for part in key.split("."):
                node = node[part]
            assert node == value, (overrides, key)
    assert _job("env=swe-local")["env"] == SWE_LOCAL_ENV


def test_sao_trains_benchmark_options_read_the_registry():
    for name in ("swe-bench-verified", "swe-bench-lite", "swe-bench", "beyond-aime", "imo-answerbench"):
        env, declared = _job(f"env={name}")["env"], budgets(name)
        assert (env["max_turns"], env["max_tokens"], env["max_tokens_per_turn"]) == \
            (declared.max_turns, declared.max_tokens, declared.max_tokens_per_turn), name
    assert _job("env=swe-bench-verified")["env"]["kwargs"] == {"max_steps": 300}
    assert _job("env=swe-bench-verified", "env.max_turns=20")["env"]["kwargs"] == {"max_steps": 20}
    assert _job("env=swe-bench-verified", "env.max_tokens=1024")["env"]["max_tokens"] == 1024  # a pin wins


def test_a_null_token_budget_passes_sao_trains_checks():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from sao.rl.cli.train import to_config
    from sao.rl.config import ConfigError, activation_checkpointing, validate

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="sao.conf", version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=["env=swe-bench-verified"]))
        validate(cfg)  # no budget: engine.max_model_len bounds the episode
        assert cfg.env.max_tokens is None and activation_checkpointing(cfg)  # may exceed 1,024 tokens
        with pytest.raises(ConfigError, match="must be below engine.max_model_len"):
            validate(to_config(compose(config_name="config", overrides=["env=swe-bench-verified",
                                                                        "env.max_tokens=4096"])))
