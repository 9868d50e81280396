"""Speculative-decoding configuration and the engine's metrics record: no engine needed."""

from __future__ import annotations

import json

import pytest

from sao.agents.engine import VLLMServerConfig
from sao.agents.engine_metrics import EngineMetrics, parse_metrics
from sao.agents.speculative import SpeculativeConfig
from sao.rl.config import EngineConfig

# Lines as vLLM 0.32 writes them (trimmed from a real /metrics of a suffix-decoding server).
METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 38.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.796141932670771e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 57.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 16.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 46.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 23.0
vllm:generation_tokens_total{engine="0",model_name="m"} 128.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""


def test_off_adds_nothing_to_the_command():
    assert SpeculativeConfig().server_args() == ()
    assert "--speculative-config" not in VLLMServerConfig(model="m").command(1)


def test_suffix_is_vllms_speculative_config_json():
    cmd = VLLMServerConfig(model="m", speculative=SpeculativeConfig("suffix", num_tokens=8)).command(1)
    config = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert config["method"] == "suffix" and config["num_speculative_tokens"] == 8
    assert "num_speculative_tokens_per_batch_size" not in config


def test_unknown_method_suggests_the_close_one():
    with pytest.raises(ValueError, match="did you mean 'suffix'"):
        SpeculativeConfig("sufix")
    with pytest.raises(ValueError, match="num_tokens"):
        SpeculativeConfig("suffix", num_tokens=0)


def test_engine_config_passes_the_method_to_the_managed_server_not_through_extra_args():
    cfg = EngineConfig(speculative="suffix", spec_tokens=8, extra_args=["--seed", "1"])
    assert cfg.extra_args == ["--seed", "1"]  # the config is not rewritten: read back, it is the same
    cmd = VLLMServerConfig(model="m", extra_args=tuple(cfg.extra_args), speculative=cfg.speculative_config()).command(1)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["num_speculative_tokens"] == 8
    with pytest.raises(ValueError, match="conflict"):
        EngineConfig(speculative="suffix", extra_args=["--speculative-config", "{}"])
    with pytest.raises(ValueError, match="did you mean 'suffix'"):
        EngineConfig(speculative="sufix")


def test_parse_metrics_reads_counters_and_gauges():
    m = parse_metrics(METRICS)
    assert (m.spec_drafts, m.spec_draft_tokens, m.spec_accepted_tokens) == (38, 57, 16)
    assert (m.prefix_cache_queries, m.prefix_cache_hits, m.generation_tokens) == (46, 23, 128)
    assert (m.running, m.waiting, m.kv_cache_usage) == (3, 1, 0.25)  # waiting_by_reason is another metric
    assert m.spec_acceptance == pytest.approx(16 / 57)
    assert m.spec_accepted_per_draft == pytest.approx(16 / 38)
    assert m.prefix_cache_hit_rate == 0.5


def test_since_is_the_window_and_rates_are_none_without_data():
    before = EngineMetrics(spec_drafts=10, spec_draft_tokens=20, spec_accepted_tokens=5, prefix_cache_queries=26,
                           prefix_cache_hits=13, running=9)
    after = parse_metrics(METRICS)
    window = after.since(before)
    assert (window.spec_draft_tokens, window.spec_accepted_tokens) == (37, 11)  # 57 - 20, 16 - 5
    assert window.prefix_cache_hit_rate == 0.5  # (23 - 13) / (46 - 26)
    assert window.running == 3  # gauges are the later reading's
    empty = parse_metrics("")
    assert empty.spec_acceptance is None and empty.prefix_cache_hit_rate is None
    assert empty.summary()["spec_acceptance"] is None


def test_eval_config_refuses_speculation_it_cannot_start(tmp_path):
    from sao.evals.runner import EvalConfig, EvalError

    suffix = SpeculativeConfig("suffix")
    with pytest.raises(EvalError, match="--base-url"):
        EvalConfig("arithmetic", tmp_path, base_url="http://x:1/v1", speculative=suffix)
    with pytest.raises(EvalError, match="--agent llm"):
        EvalConfig("arithmetic", tmp_path, agent="gold", speculative=suffix)
    assert EvalConfig("arithmetic", tmp_path, speculative=suffix).speculative.enabled
