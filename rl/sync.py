"""Weight sync from the learner to a vLLM engine, through the filesystem (works on the CPU).

:func:`save_checkpoint` writes the policy as ``root/v{version:06d}/`` (``model.safetensors`` +
``config.json``) in the dtype the engine serves; :class:`WeightSync` saves, then swaps the weights
into a running engine (pause, ``reload_weights``, version label, prefix-cache reset, resume) and
checks the result with a *probe*: the engine's log-probs on a fixed token sequence against the
learner's :func:`~sao.rl.learner.token_logprobs` on the same ids. A probe gap far above bf16
rounding noise means the engine is not serving the policy the learner trains (a wrong checkpoint
layout, a missed reload, ...), which silently breaks the importance ratios of METHOD.md item 8.

LoRA: a ``peft`` policy is written as the plain model with its adapters merged in
(:func:`sao.rl.lora.merged_state_dict`, plain Hugging Face names), so the engine reloads one dense
checkpoint exactly as for full fine-tuning; the trained model is not modified.

Tied embeddings: a model with ``tie_word_embeddings`` (SmolLM2, many small Llama/Qwen models)
shares one tensor between ``model.embed_tokens.weight`` and ``lm_head.weight``. The checkpoint keeps
only the first name of every shared tensor (``model.embed_tokens.weight``), as Hugging Face's own
checkpoints do; vLLM's loader ties its head to the embedding and skips ``lm_head.weight``.

On GPUs the disk round trip should give way to vLLM's NCCL weight transfer: see
:class:`NcclWeightSync`, a marked seam that is not implemented.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sao.agents.engine import EngineClient, PauseMode
from sao.rl.learner import token_logprobs
from sao.rl.lora import engine_view, has_lora, merged_state_dict, unwrap

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
# "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n" in SmolLM2's tokenizer.
DEFAULT_PROBE_IDS: tuple[int, ...] = (1, 4093, 198, 1780, 314, 216, 33, 34, 1232, 216, 35, 32, 47, 2, 198, 1, 520, 9531, 198)


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / f"v{version:06d}"


def list_versions(root: Path) -> list[tuple[int, Path]]:
    """The finished version folders under ``root``, oldest first (temporary folders are not listed)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _VERSION_DIR.match(p.name))]
    return sorted(found)


def _state_dict_to_save(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers, one name per shared tensor (the first), cast to ``dtype``.
    A LoRA model gives its merged weights under the plain names (module doc)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    state = merged_state_dict(model, dtype) if has_lora(model) else model.state_dict()
    model = unwrap(model)
    for name, tensor in state.items():
        t = tensor.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:  # tied: lm_head.weight is model.embed_tokens.weight
            continue
        seen[key] = name
        if t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        tensors[name] = t.to("cpu").contiguous()
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text_config, "tie_word_embeddings", False) and "lm_head.weight" in tensors:
        # Tied in the config but not in memory: vLLM would ignore the head, so the engine would
        # serve a different policy than the learner's. Say so; keep the embedding.
        emb = tensors.get("model.embed_tokens.weight")
        if emb is None or not torch.equal(emb, tensors["lm_head.weight"]):
            log.warning("tie_word_embeddings is set but lm_head.weight differs from the embedding; "
                        "the engine ties them and will serve the embedding as its head")
        del tensors["lm_head.weight"]
    return tensors


@contextlib.contextmanager
def _intra_op_threads(n: int) -> Iterator[None]:
    """Run the per-tensor casts on ``n`` intra-op threads. The casts are memory-bound and small (a few
    MB each): with a busy machine, waking the thread pool for each of ~300 tensors cost 1.2-1.7 s
    for SmolLM2-135M where one thread takes 0.25 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _write_config(model: nn.Module, folder: Path, dtype: torch.dtype) -> None:
    config = getattr(unwrap(model), "config", None)
    if config is None or not hasattr(config, "save_pretrained"):
        raise TypeError(f"{type(model).__name__} has no Hugging Face config; pass a *ForCausalLM model")
    config.save_pretrained(folder)
    path = folder / "config.json"
    data = json.loads(path.read_text())
    data["dtype"] = str(dtype).removeprefix("torch.")
    data.pop("torch_dtype", None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_checkpoint(
    model: nn.Module, root: Path, version: int, *, keep: int = 2, dtype: torch.dtype = torch.bfloat16
) -> Path:
    """Write ``model`` as ``root/v{version:06d}/`` (``model.safetensors`` + ``config.json``) and return it.

    Written into a temporary folder under ``root`` and renamed into place, so a reader never sees a
    half-written version (an existing folder of the same version is replaced). Floating tensors are
    cast to ``dtype`` (what the engine serves); tied tensors are saved once. Then version folders
    beyond the newest ``keep`` are deleted, never the one just written.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, not {keep}")
    if version < 0:
        raise ValueError(f"version must be >= 0, not {version}")
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, version)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        with torch.no_grad(), _intra_op_threads(1):
            tensors = _state_dict_to_save(model, dtype)
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        _write_config(model, tmp, dtype)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".old-{final.name}-", dir=root))
            os.replace(final, old / final.name)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_versions(root, keep=keep, protect=version)
    return final


def prune_versions(root: Path, *, keep: int, protect: int | None = None) -> list[Path]:
    """Keep ``keep`` version folders: ``protect`` (when present) and the newest others; delete the rest.

    Returns the deleted folders. Temporary folders and anything not named ``v<digits>`` are left alone.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, not {keep}")
    versions = list_versions(root)
    survivors = {v for v, _ in versions if v == protect}
    others = [v for v, _ in versions if v != protect]
    room = keep - len(survivors)
    survivors.update(others[max(0, len(others) - room):] if room > 0 else [])
    removed = [p for v, p in versions if v not in survivors]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


class WeightSync:
    """Push the learner's policy into a running vLLM engine through ``root`` on a shared filesystem.

    ``root`` must be readable by the engine at the same path (same machine, or a shared mount).
    ``model_name`` is the served model name (for the probe's ``/v1/completions`` request).
    """

    def __init__(
        self,
        engine: EngineClient,
        root: Path,
        *,
        model_name: str,
        keep: int = 2,
        probe_ids: list[int] | None = None,
        warn_gap: float = 0.05,
        dtype: torch.dtype = torch.bfloat16,
        pause_mode: PauseMode = "keep",
        reload_timeout_s: float | None = 300.0,
    ):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, not {keep}")
        self.engine = engine
        self.root = Path(root).resolve()
        self.model_name = model_name
        self.keep = keep
        self.probe_ids = list(DEFAULT_PROBE_IDS if probe_ids is None else probe_ids)
        if len(self.probe_ids) < 2:
            raise ValueError("probe_ids needs at least 2 tokens (the first one has no log-prob)")
        self.warn_gap = warn_gap
        self.dtype = dtype
        self.pause_mode: PauseMode = pause_mode
        self.reload_timeout_s = reload_timeout_s

    async def sync(self, model: nn.Module, version: int, *, probe: bool = True) -> dict[str, float]:
        """Save ``model`` as ``version``, load it into the engine, label it, and probe it. Returns metrics.

        The checkpoint is written *before* the engine is paused (it keeps generating meanwhile);
        the pause covers reload, version label and prefix-cache reset, and ``resume`` runs whatever
        happens. With ``pause_mode="keep"`` in-flight requests continue on the new weights
        (a trajectory may span versions; METHOD.md item 10).
        """
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        folder = await asyncio.to_thread(save_checkpoint, model, self.root, version, keep=self.keep, dtype=self.dtype)
        metrics["perf/save_s"] = time.perf_counter() - started

        paused_at = time.perf_counter()
        await self.engine.pause(mode=self.pause_mode)
        try:
            reload_at = time.perf_counter()
            await self.engine.reload_weights(folder, timeout_s=self.reload_timeout_s)
            metrics["perf/reload_s"] = time.perf_counter() - reload_at
            await self.engine.set_weight_version(version)
            cache_reset = await self.engine.reset_prefix_cache()
        finally:
            await self.engine.resume()
        metrics["perf/pause_s"] = time.perf_counter() - paused_at
        metrics["perf/sync_s"] = metrics["perf/save_s"] + metrics["perf/reload_s"]
        if not cache_reset:
            log.warning("vLLM refused to reset its prefix cache after loading version %d (blocks in use); "
                        "cached prefixes computed with older weights may be reused", version)
        metrics["sync/prefix_cache_reset"] = float(cache_reset)

        label = await self.engine.weight_version()
        if label != str(version):
            log.warning("engine reports weight version %r after sync to %d", label, version)
        try:
            metrics["engine/weight_version"] = float(int(label)) if label is not None else math.nan
        except ValueError:
            metrics["engine/weight_version"] = math.nan

        if probe:
            probe_at = time.perf_counter()
            engine_lp = await self.engine_logprobs()
            learner_lp = await asyncio.to_thread(self.learner_logprobs, model, round_to=self.dtype)
            full_lp = await asyncio.to_thread(self.learner_logprobs, model)
            gaps = [abs(a - b) for a, b in zip(engine_lp, learner_lp, strict=True)]
            metrics["sync/probe_gap"] = sum(gaps) / len(gaps)
            metrics["sync/probe_gap_max"] = max(gaps)
            # the same against the full-precision master weights: adds the engine dtype's rounding
            metrics["sync/probe_gap_master"] = sum(abs(a - b) for a, b in zip(engine_lp, full_lp)) / len(gaps)
            metrics["sync/probe_engine_logprob"] = sum(engine_lp) / len(engine_lp)
            metrics["perf/probe_s"] = time.perf_counter() - probe_at
            if metrics["sync/probe_gap"] > self.warn_gap:
                log.warning("weight sync to version %d: engine and learner log-probs differ by %.4f on average "
                            "(max %.4f, warn above %.4f) on the probe; the engine may not serve the learner's policy",
                            version, metrics["sync/probe_gap"], metrics["sync/probe_gap_max"], self.warn_gap)
        return metrics

    async def engine_logprobs(self) -> list[float]:
        """The engine's log-prob of each probe token after the first, given its prefix (greedy, 1 new token)."""
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": self.probe_ids,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 0,
        }
        # EngineClient's HTTP client carries the server root and the API key; completions live under /v1.
        resp = await self.engine._http.post("/v1/completions", json=body, timeout=self.reload_timeout_s)
        if resp.status_code >= 400:
            from sao.agents.errors import EngineError

            raise EngineError(f"POST {self.engine.root_url}/v1/completions: HTTP {resp.status_code}: {resp.text[:500]}",
                              status_code=resp.status_code, body=resp.text)
        per_position = resp.json()["choices"][0]["prompt_logprobs"][1:]  # the first token has no prefix
        return [float(entry[str(tok)]["logprob"]) for tok, entry in zip(self.probe_ids[1:], per_position, strict=True)]

    def learner_logprobs(self, model: nn.Module, *, round_to: torch.dtype | None = None) -> list[float]:
        """The learner's log-prob of each probe token after the first (no gradients, model's own dtype).

        ``round_to``: compute with every floating parameter rounded to that dtype first (what the engine
        was sent), so the gap isolates "the engine serves these weights" from the precision the engine
        serves them in: once training has moved the fp32 master weights off the bf16 grid, rounding
        alone moves log-probs by a few hundredths, about the size of a real missed update. The
        parameters are swapped for rounded copies and put back afterwards (one extra copy in memory).
        A LoRA model computes with its merged weights rounded, as the engine does (adapters zeroed
        meanwhile: :func:`sao.rl.lora.engine_view`).
        """
        device = next(model.parameters()).device
        ids = torch.tensor([self.probe_ids], dtype=torch.long, device=device)
        originals: list[tuple[nn.Parameter, torch.Tensor]] = []
        with torch.no_grad():
            try:
                if round_to is not None:
                    swaps = engine_view(model, round_to) if has_lora(model) else [
                        (p, p.data.to(round_to).to(p.dtype)) for p in model.parameters()
                        if p.is_floating_point() and p.dtype != round_to]
                    for p, data in swaps:
                        originals.append((p, p.data))
                        p.data = data
                out = token_logprobs(model, ids, torch.ones_like(ids))
            finally:
                for p, data in originals:
                    p.data = data
        return out[0, 1:].tolist()


class WeightPublisher:
    """The learner's side of a weight update when a rollout orchestrator owns the engines: write the
    version's checkpoint under ``root`` and return; the orchestrator decides when each replica loads it
    (:class:`sao.rl.orchestrated.OrchestratedRollout`). Same call as :class:`WeightSync`."""

    def __init__(self, root: Path, *, keep: int = 6, dtype: torch.dtype = torch.bfloat16):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, not {keep}")
        self.root, self.keep, self.dtype = Path(root).resolve(), keep, dtype

    async def sync(self, model: nn.Module, version: int, *, probe: bool = True) -> dict[str, float]:
        started = time.perf_counter()
        await asyncio.to_thread(save_checkpoint, model, self.root, version, keep=self.keep, dtype=self.dtype)
        save_s = time.perf_counter() - started
        return {"perf/save_s": save_s, "perf/sync_s": save_s, "learner/version": float(version)}


class NcclWeightSync:
    """SEAM, NOT IMPLEMENTED: in-memory weight transfer to vLLM over NCCL (GPUs only).

    Where it plugs in: the same contract as :class:`WeightSync` (``async sync(model, version) ->
    metrics``), with the disk round trip (``save_checkpoint`` + ``/collective_rpc reload_weights``)
    replaced by vLLM's weight-transfer engine, which the dev-mode server exposes:

    1. once: ``POST /init_weight_transfer_engine`` on the server while the learner joins the same
       NCCL group (the learner as rank 0, the engine's workers as the other ranks; vLLM's
       ``StatelessProcessGroup`` / ``PyNcclCommunicator`` on a host:port both sides reach);
    2. per sync: pause, ``POST /update_weights`` with each tensor's name, dtype and shape while the
       learner broadcasts the tensors (in the served dtype, tied tensors once, in that order),
       then set the version label, reset the prefix cache, resume, and run the same probe.

    It needs CUDA devices on both sides and a vLLM build with NCCL; neither exists in the CPU
    setup this project is tested on, so it is deliberately left unimplemented rather than faked.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(
            "NcclWeightSync is a seam for GPU deployments (vLLM /init_weight_transfer_engine + /update_weights "
            "over NCCL) and is not implemented; use WeightSync (safetensors on disk + reload_weights)"
        )
