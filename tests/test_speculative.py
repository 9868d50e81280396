"""Speculative-decoding configuration and the engine's metrics record: no engine needed."""

from __future__ import annotations

import inspect
import json

import pytest

from sao.agents.engine.metrics import EngineMetrics, parse_metrics
from sao.agents.engine.server import VLLMServerConfig
from sao.agents.engine.speculative import SpeculativeConfig
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


def test_a_load_aware_schedule_is_vllms_per_batch_size_schedule():
    from sao.agents.engine.speculative import load_aware, parse_schedule, schedule_flag

    policy = load_aware(4, 24)
    schedule = policy.schedule
    assert policy.method == "suffix" and schedule == ((1, 4, 24), (5, 5, 0)) == parse_schedule("1-4:24,5-:0")
    assert schedule_flag(policy) == "--speculative suffix --spec-schedule 1-4:24,5-:0"
    # speculation lost at every measured load: plain decoding, not a suffix engine that drafts nothing
    assert load_aware(None, 24) == SpeculativeConfig() and schedule_flag(load_aware(None, 24)) == "--speculative none"
    assert schedule_flag(SpeculativeConfig("suffix")) == "--speculative suffix"
    cmd = VLLMServerConfig(model="m", speculative=SpeculativeConfig("suffix", schedule=schedule)).command(1)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["num_speculative_tokens_per_batch_size"] == [
        [1, 4, 24], [5, 5, 0]]
    engine = EngineConfig(speculative="suffix", spec_schedule=[[1, 2, 8], [3, 3, 0]])
    assert engine.speculative_config().schedule == ((1, 2, 8), (3, 3, 0))
    for bad, match in (([[2, 4, 8]], "start at 1"), ([[1, 4, 8], [3, 5, 0]], "follow one another"),
                       ([[1, 4, -1]], "draft tokens >= 0"), ([[1, 4]], "whole numbers"), ([[1, 2.5, 3]], "whole numbers")):
        with pytest.raises(ValueError, match=match):
            SpeculativeConfig("suffix", schedule=bad)
    with pytest.raises(ValueError, match="needs a speculative method"):
        SpeculativeConfig(schedule=((1, 1, 0),))
    with pytest.raises(ValueError, match="FIRST-LAST:TOKENS"):
        parse_schedule("1-4")


class _Batch:
    """The fields of vLLM's InputBatch that the suffix proposer reads, for requests in a row."""

    def __init__(self, prompts: dict[str, list[int]], outputs: dict[str, list[int]]):
        import numpy as np

        self.req_ids = list(prompts)
        self.req_id_to_index = {r: i for i, r in enumerate(self.req_ids)}
        rows = [prompts[r] + outputs[r] for r in self.req_ids]
        self.token_ids_cpu = np.zeros((len(rows), 64), dtype=np.int32)
        for i, row in enumerate(rows):
            self.token_ids_cpu[i, :len(row)] = row
        self.num_tokens_no_spec = [len(r) for r in rows]
        self.num_prompt_tokens = [len(prompts[r]) for r in self.req_ids]


def test_the_plugin_makes_vllms_suffix_proposer_draft_the_steps_length():
    """vLLM's own SuffixDecodingProposer (arctic-inference's suffix trees): unpatched it asserts the step's
    draft length is its maximum (what killed the engine at a schedule's threshold); patched it drafts at
    most the step's length, none at 0, and keeps every request's trees up to date either way."""
    suffix = pytest.importorskip("vllm.v1.spec_decode.suffix_decoding")
    pytest.importorskip("arctic_inference.suffix_decoding")
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    from sao.agents.engine.vllm_plugins.suffix_step_length import PATCHED, honour_step_length

    def proposer(cls):  # type: ignore[no-untyped-def]
        p = cls.__new__(cls)  # its __init__ wants a whole VllmConfig; these are the fields propose reads
        p.num_speculative_tokens, p.max_tree_depth, p.max_spec_factor, p.min_token_prob = 8, 24, 4.0, 0.0
        p.max_model_len = 64
        p.suffix_cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=100)
        return p

    pattern = [5, 6, 7, 8, 9, 10, 11, 12]
    prompts = {"a": pattern * 3}  # the prompt repeats itself: its own tree predicts the continuation
    outputs = {"a": pattern[:2]}  # the response so far repeats the pattern's start

    class Unpatched(suffix.SuffixDecodingProposer):  # vLLM's body, even where the plugin already ran
        propose = inspect.unwrap(suffix.SuffixDecodingProposer.propose)

    with pytest.raises(AssertionError):
        proposer(Unpatched).propose(2, _Batch(prompts, outputs), [[6]])

    class Patched(suffix.SuffixDecodingProposer):
        pass

    assert honour_step_length(Patched) and honour_step_length(Patched)  # idempotent
    assert getattr(Patched, PATCHED)
    p = proposer(Patched)
    full = p.propose(8, _Batch(prompts, outputs), [[6]])
    assert 2 < len(full[0]) <= 8 and full[0][:3] == [7, 8, 9], full  # the prompt's own continuation
    q = proposer(Patched)
    short = q.propose(2, _Batch(prompts, outputs), [[6]])
    assert short == [full[0][:2]] and q.num_speculative_tokens == 8  # at most 2; the maximum is put back
    r = proposer(Patched)
    assert r.propose(0, _Batch(prompts, outputs), [[6]]) == [[]]  # no drafts at 0 ...
    assert "a" in r.suffix_cache.active_requests  # ... and the request's trees were still started
    assert proposer(Patched).propose(99, _Batch(prompts, outputs), [[6]]) == full  # never above the maximum


def test_the_plugin_is_registered_for_vllm_and_leaves_an_unknown_propose_alone():
    from importlib.metadata import entry_points

    from sao.agents.engine.vllm_plugins.suffix_step_length import honour_step_length

    names = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "sao.agents.engine.vllm_plugins.suffix_step_length:register" in names, names

    class Other:
        def propose(self, drafts):  # type: ignore[no-untyped-def]
            return drafts

    assert not honour_step_length(Other) and Other().propose([1]) == [1]
