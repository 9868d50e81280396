"""Suffix decoding keeps sampling exact: on the real vLLM with the bundled model, the log-probs the engine
records with speculation on are the target model's, as with it off.

The same seeded episodes run on two engines, one after the other: the session's shared one (plain, served
as sao-train serves it) and one started with ``--speculative-config {"method": "suffix"}`` and otherwise
the same configuration (one engine start, not two: CI time). The learner's scoring code
(``sao.rl.learner.batch.collate`` and ``sao.rl.learner.learner.token_logprobs``, as behind ``rollout/logprob_gap``)
scores both sets of trajectories with the HF model; the gap |engine log-prob - HF log-prob| at
action tokens must stay within 0.01 of the gap without speculation (issue 11, WAR).

The speculating engine runs with a load-aware schedule, 24 draft tokens while one request runs and none
above (vLLM's per-batch-size schedule, honoured by ``sao.agents.engine.vllm_plugins.suffix_step_length``; without it the engine
died at the threshold, "assert num_speculative_tokens == self.num_speculative_tokens"). The episodes
run one at a time, so they draft; then a burst of 4 requests at once crosses the threshold: the engine
lives, drafts (almost) nothing while several run, and drafts again for a lone request afterwards.
"""

from __future__ import annotations

import asyncio

import pytest

import sao.envs as E
from sao.agents import ChatRenderer, LoopConfig, OpenAICompletionClient, run_episode
from sao.agents.engine.metrics import EngineMetrics, read_metrics
from sao.agents.engine.server import VLLMServer, VLLMServerConfig
from sao.agents.engine.speculative import SpeculativeConfig
from sao.envs.arithmetic import ArithmeticTasks
from tests.conftest import ENGINE_DTYPE, _require

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.long]

TASKS = 2  # episodes run one at a time on 2 cores: decoding is this test's cost (4 tasks: 334 s of CI's setup)
SAMPLES = 2  # the second sample of a task can draft from the first one's response (the global tree)
LOAD_AWARE = ((1, 1, 24), (2, 2, 0))  # draft while one request runs, not above


def _episodes(server: VLLMServer, tokenizer, temperature: float) -> list:  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        client = OpenAICompletionClient(server.base_url, server.model_name)
        renderer = ChatRenderer(tokenizer)
        cfg = LoopConfig(max_tokens=128, max_turns=2, temperature=temperature)
        try:
            out = []
            ids = ArithmeticTasks(seed=0, difficulty=0.5).ids(TASKS)
            for sample in range(SAMPLES):  # one at a time: concurrency 1, where speculation is on
                for i, task_id in enumerate(ids):
                    env = E.make("arithmetic", feedback_turns=1)
                    out.append(await run_episode(env, client, renderer, cfg, env_name="arithmetic", task_id=task_id,
                                                 sample=sample, seed=100 * i + sample))
            return out
        finally:
            await client.aclose()

    return asyncio.run(go())


def _measured(server: VLLMServer, tokenizer):  # type: ignore[no-untyped-def]
    before = read_metrics(server.root_url)
    runs = {t: _episodes(server, tokenizer, t) for t in (1.0, 0.0)}
    return runs, read_metrics(server.root_url).since(before)


COUNT = "Count: " + " ".join(str(i) for i in range(1, 21)) * 2  # a greedy continuation the prompt's tree drafts


def _burst(server: VLLMServer, n: int) -> tuple[int, EngineMetrics]:
    """``n`` greedy requests at once: completion tokens, and the engine's counters over them."""
    import httpx

    async def go() -> int:
        async with httpx.AsyncClient(base_url=server.root_url, timeout=300) as client:
            async def one() -> int:
                r = await client.post("/v1/completions", json={"model": server.model_name, "prompt": COUNT,
                                                               "max_tokens": 32, "temperature": 0})
                r.raise_for_status()
                return int(r.json()["usage"]["completion_tokens"])

            return sum(await asyncio.gather(*(one() for _ in range(n))))

    before = read_metrics(server.root_url)
    tokens = asyncio.run(go())
    return tokens, read_metrics(server.root_url).since(before)


def _run(model_dir, log, speculative: SpeculativeConfig, tokenizer):  # type: ignore[no-untyped-def]
    # the shared engine's configuration (tests/conftest.py: vllm_server), with speculation
    config = VLLMServerConfig(model=str(model_dir), served_model_name="smollm2-135m", max_model_len=2048,
                              kv_cache_gib=1, log_path=log, dtype=ENGINE_DTYPE, speculative=speculative)
    with VLLMServer(config) as server:
        measured = _measured(server, tokenizer)
        bursts = [_burst(server, n) for n in (4, 1)]  # across the threshold, then a lone request again
        return measured, bursts


@pytest.fixture(scope="module")
def both(vllm_server, engine_model_dir, tmp_path_factory):  # type: ignore[no-untyped-def]
    try:
        import arctic_inference  # noqa: F401
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        _require("vLLM with arctic-inference", f"it does not import ({exc}); `pip install arctic-inference==0.3.0`")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(engine_model_dir)
    logs = tmp_path_factory.mktemp("spec")
    off = _measured(vllm_server, tokenizer)  # the plain engine: the session's, with the prepared weights
    on, bursts = _run(engine_model_dir, logs / "on.log", SpeculativeConfig("suffix", schedule=LOAD_AWARE), tokenizer)
    return off, on, bursts


def _gap(model, trajectories, pad_id: int) -> float:  # type: ignore[no-untyped-def]
    import torch

    from sao.rl.learner.batch import collate
    from sao.rl.learner.learner import token_logprobs

    batch = collate(trajectories, pad_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask, only=batch.action_mask)
    act = batch.action_mask.bool()
    return float((logp - batch.rollout_logprobs).abs()[act].mean())


def test_suffix_decoding_drafts_and_its_logprobs_are_the_target_models(both, engine_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    (off_runs, off_metrics), (on_runs, on_metrics), _ = both
    assert isinstance(on_metrics, EngineMetrics)
    assert off_metrics.spec_draft_tokens == 0
    # speculation really ran: drafts were proposed and some accepted
    assert on_metrics.spec_draft_tokens > 0 and on_metrics.spec_accepted_tokens > 0, on_metrics
    model = AutoModelForCausalLM.from_pretrained(engine_model_dir, dtype=getattr(torch, ENGINE_DTYPE)).eval()
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    for temperature in (1.0, 0.0):
        off, on = off_runs[temperature], on_runs[temperature]
        assert all(t.status == "ok" for t in off + on), [t.error for t in off + on if t.status != "ok"]
        gap_off, gap_on = _gap(model, off, pad), _gap(model, on, pad)
        same = sum(a.token_ids == b.token_ids for a, b in zip(off, on, strict=True))
        print(f"\ntemperature {temperature}: logprob_gap off {gap_off:.5f}, on {gap_on:.5f}; identical episodes "
              f"{same}/{len(off)}; acceptance {on_metrics.spec_acceptance:.3f}")
        assert abs(gap_on - gap_off) <= 0.01, (temperature, gap_off, gap_on)


def test_a_load_aware_schedule_drafts_at_low_load_only_and_the_engine_lives_across_it(both):
    _, _, ((many, at_4), (one, at_1)) = both
    print(f"\n4 at once: {many} tokens, {at_4.spec_draft_tokens} draft tokens; then 1: {one} tokens, "
          f"{at_1.spec_draft_tokens} draft tokens, {at_1.spec_accepted_tokens} accepted")
    assert many > 0 and one > 0  # every request answered: the engine crossed the threshold and lived
    assert at_1.spec_draft_tokens > 0 and at_1.spec_accepted_tokens > 0  # alone again: it drafts
    # while several run, no drafts (a few when the last ones finish unevenly and one runs alone)
    assert at_4.spec_draft_tokens / many < at_1.spec_draft_tokens / one, (at_4, at_1)
