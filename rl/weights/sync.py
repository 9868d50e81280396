"""Weight sync from the learner to a vLLM engine, through the filesystem (works on the CPU).

:func:`save_checkpoint` writes the policy as ``root/v{version:06d}/`` (``model.safetensors`` +
``config.json``) in the dtype the engine serves; :class:`WeightSync` saves, then swaps the weights
into a running engine (:func:`~sao.rl.weights.load.load_weights`: pause, ``reload_weights``, version
label, prefix-cache reset, resume) and
checks the result with a *probe*: the engine's log-probs on a fixed token sequence against the
learner's :func:`~sao.rl.learner.learner.token_logprobs` on the same ids. A probe gap far above bf16
rounding noise means the engine is not serving the policy the learner trains (a wrong checkpoint
layout, a missed reload, ...), which silently breaks the importance ratios of METHOD.md item 8.

LoRA: a ``peft`` policy is written as the plain model with its adapters merged in
(:func:`sao.rl.learner.lora.merged_state_dict`, plain Hugging Face names), so the engine reloads one dense
checkpoint exactly as for full fine-tuning; the trained model is not modified.

Tied embeddings: a model with ``tie_word_embeddings`` (SmolLM2, many small Llama/Qwen models)
shares one tensor between ``model.embed_tokens.weight`` and ``lm_head.weight``. The engine is served
UNTIED and every checkpoint holds both tensors (the same values) with ``tie_word_embeddings: false``.
Why (measured, issue 13): vLLM 0.32 on the CPU repacks each linear layer's weight for its GEMM
kernel after loading, and an in-place ``reload_weights`` re-processes only the layers whose
weights it loaded; a tied head loads nothing of its own (the loader skips ``lm_head.weight``), so
the engine kept computing logits with the INITIAL head while the embedding moved. The probe
showed it: fp32 engine against fp32 learner, 8e-6 at version 0, then 0.003, 0.005, 0.006, 0.007
after steps 1-4, and the rollout's log-prob gap grew with it (0.03 -> 0.14 in 4 steps); scoring the
engine's log-probs with the checkpoint's embedding and the initial head matched them to 8e-6.
:func:`export_engine_model` writes the untied copy a managed engine starts from; an external
engine must be started from such a copy too (``python -m sao.rl.weights.export``), or its
head never moves; :func:`check_engine_untied` refuses one that was not.

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
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sao.agents.engine import EngineClient, PauseMode
from sao.rl.learner import engine_view, has_lora, merged_state_dict, token_logprobs, unwrap
from sao.rl.weights.load import load_weights

log = logging.getLogger(__name__)

# runs torch work off the event loop: ``await offload(fn, *args, **kwargs)`` (asyncio.to_thread's shape)
Offload = Callable[..., Awaitable[Any]]

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
    if _tied(model) and "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
        # served untied (module doc): the head is written as its own tensor, equal to the embedding
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    return tensors


def _tied(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text_config, "tie_word_embeddings", False))


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
    if data.get("tie_word_embeddings"):
        data["tie_word_embeddings"] = False  # served untied: the head is its own tensor (module doc)
    if isinstance(data.get("text_config"), dict) and data["text_config"].get("tie_word_embeddings"):
        data["text_config"]["tie_word_embeddings"] = False
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                    "tokenizer.model", "chat_template.jinja", "chat_template.json", "generation_config.json",
                    "added_tokens.json")


def export_engine_model(model: nn.Module, model_dir: Path, folder: Path, *, dtype: torch.dtype) -> Path:
    """The folder a managed engine starts from: ``model``'s weights in ``dtype``, untied (module
    doc), with the tokenizer and chat template files of ``model_dir`` beside them. Written once per
    run (a second call keeps what is there: a restarted replica starts from the same weights and
    then loads the newest version)."""
    folder = Path(folder)
    if (folder / WEIGHTS_FILE).exists() and (folder / "config.json").exists():
        return folder
    tmp = save_checkpoint(model, folder.parent / f".{folder.name}-tmp", 0, keep=1, dtype=dtype)
    for name in TOKENIZER_FILES:
        src = Path(model_dir) / name
        if src.exists():
            shutil.copy2(src, tmp / name)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    shutil.rmtree(folder.parent / f".{folder.name}-tmp", ignore_errors=True)
    return folder


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
    except Exception as exc:  # a full disk: safetensors' own error, not an OSError (sao.rl.training.checkpoint)
        from sao.rl.training.checkpoint import CheckpointError, failed_write, write_failure

        if not failed_write(exc):
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        reason = write_failure(exc, root)
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write weights version {version} in {root}: {reason}") from exc
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


def weight_change(model: nn.Module, previous: Path, current: Path) -> dict[str, float]:
    """How one sync changes the served weights (``previous`` and ``current`` version folders) and
    what the engine's dtype keeps of the learner's master weights:

    - ``sync/changed_frac``: the fraction of served elements that differ from the previous version
      (bf16 serving rounds most small updates away: 5% after 9 steps in issue 13's run);
    - ``sync/update_norm``: the L2 norm of the served change;
    - ``sync/lost_norm``: the L2 norm of master - served, the part of the learner's weights the
      engine does not have (0 when it serves the master's dtype); ``sync/lost_frac`` relates it to
      the update norm (a value near or above 1: updates are mostly rounded away).
    A LoRA policy is compared on its merged weights."""
    from safetensors import safe_open

    master = merged_state_dict(model) if has_lora(model) else unwrap(model).state_dict()
    changed = total = 0
    update_sq = lost_sq = 0.0
    with torch.no_grad(), safe_open(str(Path(previous) / WEIGHTS_FILE), "pt") as old, \
            safe_open(str(Path(current) / WEIGHTS_FILE), "pt") as new:
        old_names = set(old.keys())
        for name in new.keys():
            served = new.get_tensor(name)
            if not served.is_floating_point():
                continue
            total += served.numel()
            if name in old_names:
                before = old.get_tensor(name)
                changed += int((served != before).sum())
                update_sq += float((served.float() - before.float()).square().sum())
            if name in master:
                lost_sq += float((master[name].detach().float().cpu() - served.float()).square().sum())
    update = math.sqrt(update_sq)
    return {"sync/changed_frac": changed / max(total, 1), "sync/update_norm": update,
            "sync/lost_norm": math.sqrt(lost_sq), "sync/lost_frac": math.sqrt(lost_sq) / update if update else math.nan}


async def check_engine_untied(engine: EngineClient) -> None:
    """Raise :class:`~sao.rl.config.ConfigError` when the engine was started from a model folder whose
    config ties the LM head to the embedding: its head would never take an update (module doc). A
    folder this process cannot read (another machine) is let through with a warning."""
    from sao.rl.config import ConfigError

    root = await engine.served_model_dir()
    config = Path(root) / "config.json" if root else None
    if config is None or not config.is_file():
        log.warning("cannot read the engine's model folder (%s) to check that its LM head is untied; if it was "
                    "started from a tied checkpoint, its head will never follow the learner", root)
        return
    data = json.loads(config.read_text())
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    if data.get("tie_word_embeddings") or text.get("tie_word_embeddings"):
        raise ConfigError(
            f"the engine at {engine.root_url} serves {root}, whose LM head is tied to its embedding: vLLM would "
            "never reload the head, and the engine would keep sampling with the initial one. Start it from an "
            f"untied copy: python -m sao.rl.weights.export MODEL DIR --dtype ENGINE_DTYPE, then vLLM --model DIR")


class WeightSync:
    """Push the learner's policy into a running vLLM engine through ``root`` on a shared filesystem.

    ``root`` must be readable by the engine at the same path (same machine, or a shared mount).
    ``model_name`` is the served model name (for the probe's ``/v1/completions`` request).
    ``offload(fn, *args, **kwargs)`` runs the torch work (the save, the probes) off the event loop:
    the run's :class:`sao.rl.learner.torch_thread.TorchThread` (its ``run``), or by default a worker thread.
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
        offload: Offload = asyncio.to_thread,
    ):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, not {keep}")
        self.offload = offload
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

    async def sync(self, model: nn.Module, version: int, *, probe: bool = True,
                   recent: Sequence[Any] = ()) -> dict[str, float]:
        """Save ``model`` as ``version``, load it into the engine, label it, and probe it. Returns metrics.

        ``recent``: trajectories of the batch just trained on; their sampled (action) tokens are probed
        too (``sync/action_probe_gap``), which is where an update that does not reach the engine shows
        first: the fixed probe text is one the updates barely touch.

        The checkpoint is written *before* the engine is paused (it keeps generating meanwhile);
        the pause covers reload, version label and prefix-cache reset, and ``resume`` runs whatever
        happens. With ``pause_mode="keep"`` in-flight requests continue on the new weights
        (a trajectory may span versions; METHOD.md item 10).
        """
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        previous = [p for v, p in list_versions(self.root) if v < version]
        folder = await self.offload(save_checkpoint, model, self.root, version, keep=self.keep + 1, dtype=self.dtype)
        metrics["perf/save_s"] = time.perf_counter() - started
        if probe and previous:  # what this sync changes in the engine, and what rounding keeps from it
            metrics |= await self.offload(weight_change, model, previous[-1], folder)
        prune_versions(self.root, keep=self.keep, protect=version)

        paused_at = time.perf_counter()
        loaded = await load_weights(self.engine, folder, version, mode=self.pause_mode, timeout_s=self.reload_timeout_s)
        metrics["perf/reload_s"] = loaded.reload_s
        cache_reset = loaded.prefix_cache_reset
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
            metrics |= await self._probe(model, recent)
            metrics["perf/probe_s"] = time.perf_counter() - probe_at
            if metrics["sync/probe_gap"] > self.warn_gap:
                log.warning("weight sync to version %d: engine and learner log-probs differ by %.4f on average "
                            "(max %.4f, warn above %.4f) on the probe; the engine may not serve the learner's policy",
                            version, metrics["sync/probe_gap"], metrics["sync/probe_gap_max"], self.warn_gap)
        return metrics

    def _serves_master(self, model: nn.Module) -> bool:
        """The engine's dtype is every floating parameter's: rounding to it changes nothing."""
        return all(p.dtype == self.dtype for p in model.parameters() if p.is_floating_point())

    async def _probe(self, model: nn.Module, recent: Sequence[Any]) -> dict[str, float]:
        """The fixed probe (``sync/probe_gap*``) and the action tokens of ``recent``
        (``sync/action_probe_gap*``): mean |engine - learner| log-prob with the learner's weights rounded
        to the engine's dtype, and the same against the master weights. The engine's requests all go
        out at once and are answered while the learner scores every sequence in one padded forward."""
        seqs = [list(self.probe_ids), *(list(t.token_ids) for t in recent)]
        engine = asyncio.ensure_future(asyncio.gather(*(self.engine_logprobs(ids) for ids in seqs)))
        try:
            rounded = await self.offload(self.learner_logprobs_many, model, seqs, round_to=self.dtype)
            full = rounded if self._serves_master(model) else await self.offload(self.learner_logprobs_many, model, seqs)
            engine_lp = await engine
        finally:
            if not engine.done():
                engine.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await engine
        gaps = [abs(a - b) for a, b in zip(engine_lp[0], rounded[0], strict=True)]
        metrics = {"sync/probe_gap": sum(gaps) / len(gaps), "sync/probe_gap_max": max(gaps),
                   # the same against the full-precision master weights: adds the engine dtype's rounding
                   "sync/probe_gap_master": sum(abs(a - b) for a, b in zip(engine_lp[0], full[0])) / len(gaps),
                   "sync/probe_engine_logprob": sum(engine_lp[0]) / len(engine_lp[0])}
        action, master = [], []
        for trajectory, e_lp, r_lp, f_lp in zip(recent, engine_lp[1:], rounded[1:], full[1:], strict=True):
            for e, r, f, a in zip(e_lp, r_lp, f_lp, trajectory.action_mask[1:], strict=True):
                if a:
                    action.append(abs(e - r))
                    master.append(abs(e - f))
        if action:
            metrics |= {"sync/action_probe_gap": sum(action) / len(action), "sync/action_probe_gap_max": max(action),
                        "sync/action_probe_gap_master": sum(master) / len(master)}
        return metrics

    async def engine_logprobs(self, ids: list[int] | None = None) -> list[float]:
        """The engine's log-prob of each token of ``ids`` (default: the probe) after the first, given its
        prefix (greedy, 1 new token)."""
        ids = self.probe_ids if ids is None else list(ids)
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": ids,
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
        return [float(entry[str(tok)]["logprob"]) for tok, entry in zip(ids[1:], per_position, strict=True)]

    def learner_logprobs(self, model: nn.Module, *, round_to: torch.dtype | None = None,
                         ids: list[int] | None = None) -> list[float]:
        """The learner's log-prob of each probe token after the first (no gradients, model's own dtype).

        ``round_to``: compute with every floating parameter rounded to that dtype first (what the engine
        was sent), so the gap isolates "the engine serves these weights" from the precision the engine
        serves them in: once training has moved the fp32 master weights off the bf16 grid, rounding
        alone moves log-probs by a few hundredths, about the size of a real missed update. The
        parameters are swapped for rounded copies and put back afterwards (one extra copy in memory).
        A LoRA model computes with its merged weights rounded, as the engine does (adapters zeroed
        meanwhile: :func:`sao.rl.learner.lora.engine_view`).
        """
        return self.learner_logprobs_many(model, [self.probe_ids if ids is None else list(ids)], round_to=round_to)[0]

    def learner_logprobs_many(self, model: nn.Module, seqs: Sequence[Sequence[int]], *,
                              round_to: torch.dtype | None = None) -> list[list[float]]:
        """:meth:`learner_logprobs` of several token lists at once: one forward of the rows padded on the
        right (a causal model's log-probs of a row do not depend on what follows it), one rounding."""
        device = next(model.parameters()).device
        width = max(len(x) for x in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for row, x in enumerate(seqs):
            ids[row, :len(x)] = torch.tensor(list(x), dtype=torch.long)
            mask[row, :len(x)] = 1
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
                out = token_logprobs(model, ids, mask)
            finally:
                for p, data in originals:
                    p.data = data
        return [out[row, 1:len(x)].tolist() for row, x in enumerate(seqs)]


class WeightPublisher:
    """The learner's side of a weight update when a rollout orchestrator owns the engines: write the
    version's checkpoint under ``root`` and return; the orchestrator decides when each replica loads it
    (:class:`sao.rl.rollout.orchestrated.OrchestratedRollout`). Same call as :class:`WeightSync`."""

    def __init__(self, root: Path, *, keep: int = 6, dtype: torch.dtype = torch.bfloat16,
                 offload: Offload = asyncio.to_thread):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, not {keep}")
        self.root, self.keep, self.dtype, self.offload = Path(root).resolve(), keep, dtype, offload

    async def sync(self, model: nn.Module, version: int, *, probe: bool = True,
                   recent: Sequence[Any] = ()) -> dict[str, float]:
        started = time.perf_counter()
        await self.offload(save_checkpoint, model, self.root, version, keep=self.keep, dtype=self.dtype)
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
