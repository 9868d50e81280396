"""Weight sync learner -> vLLM (sao.rl.weights.sync): checkpoints on disk, and the real engine swap with its probe.

The unit tests use a tiny random Llama (tied embeddings) and a fake engine; the ``vllm`` test syncs
SmolLM2-135M into the session's shared server and puts the original weights back afterwards, even
on failure, so later tests that share the server see the prepared model.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from sao.agents.engine.control import EngineClient
from sao.agents.engine.server import VLLMServer
from sao.agents.errors import EngineError
from sao.rl import NcclWeightSync, WeightSync, list_versions, save_checkpoint
from sao.rl.weights.sync import prune_versions
from tests.tiny_models import tiny_llama


def _tiny_llama(*, tie: bool = True, seed: int = 0):  # type: ignore[no-untyped-def]
    return tiny_llama(seed, vocab=96, tie=tie, max_positions=64)


def _keys(folder: Path) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        return set(fh.keys())


# --------------------------------------------------------------------------- without a server

def test_save_checkpoint_round_trip_and_pruning(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = _tiny_llama()
    root = tmp_path / "ckpt"
    folders = [save_checkpoint(model, root, v, keep=2) for v in (1, 2, 3)]
    assert folders[-1] == root / "v000003"
    assert [v for v, _ in list_versions(root)] == [2, 3]
    assert sorted(p.name for p in root.iterdir()) == ["v000002", "v000003"]  # no temporary folders left
    assert sorted(p.name for p in folders[-1].iterdir()) == ["config.json", "model.safetensors"]

    keys = _keys(folders[-1])
    # tied in the learner, served untied: the head is its own tensor (sao.rl.weights.sync module doc)
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= keys
    with safe_open(str(folders[-1] / "model.safetensors"), "pt") as fh:
        assert {fh.get_tensor(k).dtype for k in keys} == {torch.bfloat16}
    assert json.loads((folders[-1] / "config.json").read_text())["dtype"] == "bfloat16"

    loaded = AutoModelForCausalLM.from_pretrained(folders[-1], dtype=torch.float32).eval()
    assert not loaded.config.tie_word_embeddings
    expected = {k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()}
    got = loaded.state_dict()
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    assert torch.equal(loaded.lm_head.weight, loaded.model.embed_tokens.weight)
    ids = torch.randint(0, 96, (2, 12))
    reference = model.to(torch.bfloat16).float()  # the same rounding as the checkpoint
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_save_checkpoint_full_precision_untied_and_replace(tmp_path: Path) -> None:
    model = _tiny_llama(tie=False)
    folder = save_checkpoint(model, tmp_path, 7, dtype=torch.float32)
    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        assert "lm_head.weight" in fh.keys()  # untied: the head is its own tensor
        assert torch.equal(fh.get_tensor("lm_head.weight"), model.lm_head.weight)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    again = save_checkpoint(model, tmp_path, 7, dtype=torch.float32)  # same version: replaced in place
    assert again == folder and [p.name for p in tmp_path.iterdir()] == ["v000007"]
    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        assert torch.equal(fh.get_tensor("lm_head.weight"), model.lm_head.weight)


def test_pruning_never_removes_the_version_just_written(tmp_path: Path) -> None:
    model = _tiny_llama()
    for v in (5, 6, 7):
        save_checkpoint(model, tmp_path, v, keep=2)
    save_checkpoint(model, tmp_path, 3, keep=1)  # an older number (a restart): it stays, the rest go
    assert [v for v, _ in list_versions(tmp_path)] == [3]
    (tmp_path / "notes").mkdir()  # foreign folders are left alone
    assert prune_versions(tmp_path, keep=1) == []
    assert (tmp_path / "notes").is_dir()
    with pytest.raises(ValueError):
        save_checkpoint(model, tmp_path, 8, keep=0)


def test_nccl_seam_is_not_implemented() -> None:
    with pytest.raises(NotImplementedError, match="not implemented"):
        NcclWeightSync()


class _FakeEngine:
    """Records the control calls; ``fail_reload`` makes reload_weights raise like a failed HTTP call."""

    root_url = "http://fake"

    def __init__(self, *, fail_reload: bool = False):
        self.calls: list[str] = []
        self.fail_reload = fail_reload
        self.version: str | None = "default"

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append(f"pause:{mode}")

    async def resume(self) -> None:
        self.calls.append("resume")

    async def reload_weights(self, path: Path, *, timeout_s: float | None = None) -> None:
        self.calls.append("reload")
        assert (Path(path) / "model.safetensors").is_file()
        if self.fail_reload:
            raise EngineError("reload failed", status_code=500)

    async def set_weight_version(self, version: int | str) -> None:
        self.calls.append(f"version:{version}")
        self.version = str(version)

    async def weight_version(self) -> str | None:
        return self.version

    async def reset_prefix_cache(self) -> bool:
        self.calls.append("reset")
        return True


def test_sync_call_order_and_resume_on_failure(tmp_path: Path) -> None:
    model = _tiny_llama()
    engine = _FakeEngine()
    sync = WeightSync(engine, tmp_path, model_name="tiny")  # type: ignore[arg-type]
    metrics = asyncio.run(sync.sync(model, 4, probe=False))
    assert engine.calls == ["pause:keep", "reload", "version:4", "reset", "resume"]
    assert metrics["engine/weight_version"] == 4.0 and metrics["sync/prefix_cache_reset"] == 1.0
    assert metrics["perf/sync_s"] == pytest.approx(metrics["perf/save_s"] + metrics["perf/reload_s"])

    failing = _FakeEngine(fail_reload=True)
    sync = WeightSync(failing, tmp_path, model_name="tiny")  # type: ignore[arg-type]
    with pytest.raises(EngineError):
        asyncio.run(sync.sync(model, 5, probe=False))
    assert failing.calls == ["pause:keep", "reload", "resume"]  # resumed although the reload failed


def test_the_probe_scores_every_sequence_in_one_forward_as_it_would_one_by_one(tmp_path: Path) -> None:
    import types

    import torch

    model = _tiny_llama(tie=False)
    sync = WeightSync(_FakeEngine(), tmp_path, model_name="tiny", probe_ids=[3, 9, 27, 81, 50],  # type: ignore[arg-type]
                      dtype=torch.bfloat16)
    seqs = [[5, 6, 7], [11, 12, 13, 14, 15, 16, 17, 18], [40, 41, 42, 43, 44]]
    for round_to in (None, torch.bfloat16):
        many = sync.learner_logprobs_many(model, seqs, round_to=round_to)
        one = [sync.learner_logprobs(model, ids=x, round_to=round_to) for x in seqs]
        assert [len(x) for x in many] == [2, 7, 4]
        for a, b in zip(many, one, strict=True):
            assert a == pytest.approx(b, abs=1e-5)
    assert sync.learner_logprobs_many(model, seqs) != sync.learner_logprobs_many(model, seqs, round_to=torch.bfloat16)

    # the engine answers each sequence with the rounded learner's log-probs, off by 0.1 at positions 3+
    async def engine_logprobs(ids=None):  # type: ignore[no-untyped-def]
        lp = sync.learner_logprobs(model, ids=ids, round_to=torch.bfloat16)
        return [x + (0.1 if i >= 2 else 0.0) for i, x in enumerate(lp)]

    sync.engine_logprobs = engine_logprobs  # type: ignore[method-assign]
    recent = [types.SimpleNamespace(token_ids=tuple(x), action_mask=m) for x, m in
              ((seqs[1], (0, 0, 0, 0, 1, 1, 1, 1)), (seqs[2], (0, 0, 1, 1, 1)))]
    metrics = asyncio.run(sync._probe(model, recent))
    # The learner's side is one padded forward of every probe row, the engine's above one forward per row:
    # the same fp32 model, but batched and single matmuls round differently, so a position's log-probs can
    # differ by a few 1e-4 (0.10028 seen for the max, 2026-12-04) besides the 0.1 put in. 2e-3 still tells
    # the 0.1 offsets, and where they are, from anything else.
    # fixed probe (5 tokens, 4 log-probs): positions 2 and 3 are off by 0.1 -> mean 0.05
    assert metrics["sync/probe_gap"] == pytest.approx(0.05, abs=2e-3)
    # action tokens: row 1's tokens 4..7 (log-prob positions 3..6, all off), row 2's tokens 2..4 (1..3: 2 off)
    assert metrics["sync/action_probe_gap"] == pytest.approx((4 * 0.1 + 2 * 0.1) / 7, abs=2e-3)
    assert metrics["sync/action_probe_gap_master"] > 0  # the master is not on the bf16 grid
    assert metrics["sync/probe_gap_max"] == pytest.approx(0.1, abs=2e-3)


# --------------------------------------------------------------------------- against the real vLLM

@pytest.mark.vllm
@pytest.mark.part("vllm-weight-sync")
def test_weight_sync_into_vllm(restore_engine: VLLMServer, smollm2_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    server = restore_engine
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    root = tmp_path / "weights"

    async def run() -> tuple[list[dict], list[list[float]], list[float | str | None]]:
        async with EngineClient(server.root_url) as client:
            sync = WeightSync(client, root, model_name=server.model_name, keep=2)
            metrics, probes, labels = [], [], []
            # (1) the unchanged policy
            metrics.append(await sync.sync(model, 1))
            labels.append(await client.weight_version())
            probes.append(await sync.engine_logprobs())
            # (2) a perturbed policy: halving the final norm halves every logit (a flatter distribution)
            with torch.no_grad():
                model.model.norm.weight.mul_(0.5)
            metrics.append(await sync.sync(model, 2))
            labels.append(await client.weight_version())
            probes.append(await sync.engine_logprobs())
            # (3) a third version: only `keep` folders stay
            with torch.no_grad():
                model.model.norm.weight.mul_(2.0)  # back to the original
            metrics.append(await sync.sync(model, 3))
            labels.append(await client.weight_version())
            probes.append(await sync.engine_logprobs())
            return metrics, probes, labels

    metrics, probes, labels = asyncio.run(run())
    for v, m in enumerate(metrics, start=1):
        print(f"\nsync v{v}: save {m['perf/save_s']:.3f} s, reload {m['perf/reload_s']:.3f} s, "
              f"sync {m['perf/sync_s']:.3f} s (paused {m['perf/pause_s']:.3f} s), "
              f"probe gap mean {m['sync/probe_gap']:.5f} max {m['sync/probe_gap_max']:.5f}")

    assert labels == ["1", "2", "3"]
    assert [m["engine/weight_version"] for m in metrics] == [1.0, 2.0, 3.0]
    assert all(m["perf/sync_s"] > 0 and m["perf/reload_s"] > 0 for m in metrics)
    # The engine serves what the learner holds, each time (bf16 engine vs fp32 learner: rounding only).
    assert all(m["sync/probe_gap"] < 0.05 for m in metrics), [m["sync/probe_gap"] for m in metrics]
    # The perturbation reached the engine ...
    moved = sum(abs(a - b) for a, b in zip(probes[0], probes[1])) / len(probes[0])
    print(f"engine log-probs moved by {moved:.4f} (mean) between v1 and v2")
    assert moved > 0.05
    # ... and undoing it brings the engine back (v3 holds v1's weights, bit for bit after the bf16 cast).
    assert max(abs(a - b) for a, b in zip(probes[0], probes[2])) < 1e-3
    assert [v for v, _ in list_versions(root)] == [2, 3]
    assert "lm_head.weight" in _keys(root / "v000003")
