"""Resumable training state under ``RUN_DIR/checkpoints/``.

One folder per saved step, ``step_000005/``:

* ``policy.safetensors`` / ``value.safetensors``: full-precision weights (tied tensors once); for
  a LoRA run (``model.lora``) the wrapped models as they are, base weights and adapters (peft's
  names), so a resumed run continues with the same adapters;
* ``optim.pt``: the optimizers' and the value scheduler's state;
* ``rng.pt``: Python, NumPy and torch (CPU and CUDA) generator states;
* ``state.json``: the step, the weight version, the critic pretraining progress, the rollout
  source's state (the prompt cursor) and the algorithm's state (e.g. a running baseline).

A folder is written under a temporary name and renamed, then ``latest`` (a one-line file naming it)
is replaced atomically, so a crash at any point leaves the previous checkpoint intact. Older
folders beyond ``keep`` are deleted after the new one is in place. A write that fails (a full
disk: safetensors and ``torch.save`` raise their own errors, not ``OSError``) removes what it wrote
and raises :class:`CheckpointError` with one line that says why, how much space is left, and which
checkpoint ``latest`` still names.

Reading: :meth:`Checkpointer.latest` returns the newest checkpoint that is readable -- every file
present, ``state.json`` whole, each safetensors file's header covering the file, each ``.pt`` a
whole zip archive (a truncated one has lost its central directory). A damaged newer one (copied in
part, cut by a crash of the machine before its data reached the disk) is skipped with a warning
that names it and why: the run resumes from the previous one, its logs are rewound to that step,
and the steps after it run again, so nothing is lost or trained twice. When checkpoints exist but
none is readable, resuming is refused (:class:`CheckpointError`) rather than starting over.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model

from sao.rl.errors import CheckpointError
from sao.rl.learner import Learner

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
_TMP_PREFIX = ".tmp-step_"


def failed_write(exc: BaseException) -> bool:
    """Whether ``exc`` is how a file write fails: an ``OSError``, safetensors' ``SafetensorError``, or
    ``torch.save``'s ``RuntimeError`` ("PytorchStreamWriter failed writing file ...")."""
    return isinstance(exc, (OSError, RuntimeError)) or type(exc).__name__ == "SafetensorError"


def write_failure(exc: BaseException, where: Path) -> str:
    """Why a write under ``where`` failed, in a few words: a full disk is named as such (safetensors
    and ``torch.save`` report it in their own words), with the space left on that file system."""
    text = " ".join(str(exc).split())
    code = exc.errno if isinstance(exc, OSError) else None
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    full = code in (errno.ENOSPC, errno.EDQUOT) or any(
        k in text for k in ("No space left", "StorageFull", "Disk quota")) or (free is not None and free < 2**20)
    if full:
        reason = "no space left on device"
    elif isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        reason = f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
    return reason if free is None else f"{reason} ({free / 2**20:.0f} MiB free there)"


@dataclass(frozen=True)
class TrainState:
    step: int  # policy steps done
    version: int  # the weight version the engine serves (= step)
    pretrain_steps: int  # critic-only steps done
    source: dict[str, Any]
    algo: dict[str, Any]


def capture_rng() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(self, root: Path, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root, self.keep = Path(root), keep

    def steps(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        return sorted((int(m.group(1)), p) for p in self.root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name)))

    def latest(self) -> Path | None:
        """The newest readable checkpoint (``latest``'s, unless a newer or it is damaged: module doc);
        None when there is none. :class:`CheckpointError` when some exist and none is readable."""
        candidates = [p for _, p in self.steps()]
        pointer = self.root / "latest"
        if pointer.is_file():
            named = self.root / pointer.read_text().strip()
            if named in candidates:  # a newer complete folder whose pointer update failed is not trusted
                candidates = candidates[:candidates.index(named) + 1]
        problems = []
        for folder in reversed(candidates):
            problem = self.check(folder)
            if problem is None:
                if problems:
                    log.warning("checkpoint(s) skipped as unreadable: %s; resuming from %s instead (the steps after "
                                "it run again)", "; ".join(problems), folder.name)
                return folder
            problems.append(f"{folder.name}: {problem}")
        if problems:
            raise CheckpointError(f"no readable checkpoint in {self.root}: {'; '.join(problems)}")
        return None

    @staticmethod
    def check(folder: Path) -> str | None:
        """What makes ``folder`` unreadable (a missing, truncated or broken file), or None (module doc).
        Cheap: headers and zip directories are read, not the tensors."""
        folder = Path(folder)
        try:
            data = json.loads((folder / "state.json").read_text())
            missing = [k for k in ("step", "version", "pretrain_steps", "source", "algo") if k not in data]
            if missing:
                return f"state.json lacks {', '.join(missing)}"
        except FileNotFoundError:
            return "state.json is missing"
        except (OSError, ValueError) as exc:
            return f"state.json is unreadable ({type(exc).__name__}: {exc})"
        names = ["policy.safetensors", "optim.pt", "rng.pt"]
        if (folder / "value.safetensors").exists():
            names.append("value.safetensors")
        for name in names:
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            try:
                if name.endswith(".safetensors"):
                    with safe_open(str(path), framework="pt") as f:  # its header must cover the whole file
                        f.keys()
                else:
                    with zipfile.ZipFile(path) as z:  # torch.save's archive; truncated: no central directory
                        z.namelist()
            except Exception as exc:  # noqa: BLE001 - any failure to open is a damaged file
                return f"{name} is truncated or damaged ({' '.join(str(exc).split())[:160]})"
        return None

    def save(self, learner: Learner, state: TrainState) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(f"{_TMP_PREFIX}*"):  # left by a save that a kill cut short
            shutil.rmtree(stale, ignore_errors=True)
        final = self.root / f"step_{state.step:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=self.root))
        try:
            save_model(learner.policy, str(tmp / "policy.safetensors"))
            optim: dict[str, Any] = {"policy": learner.policy_optimizer.state_dict(),
                                     "policy_scheduler": learner.policy_scheduler.state_dict()}
            if learner.value_model is not None:
                save_model(learner.value_model, str(tmp / "value.safetensors"))
                optim["value"] = learner.value_optimizer.state_dict()
                optim["value_scheduler"] = learner.value_scheduler.state_dict()
            torch.save(optim, tmp / "optim.pt")
            torch.save(capture_rng(), tmp / "rng.pt")
            (tmp / "state.json").write_text(json.dumps(
                {"step": state.step, "version": state.version, "pretrain_steps": state.pretrain_steps,
                 "source": state.source, "algo": state.algo}, indent=2) + "\n")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except Exception as exc:
            if not failed_write(exc):
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            reason = write_failure(exc, self.root)  # before the clean-up frees the space
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"could not write checkpoint {final.name} in {self.root}: {reason}; nothing of it "
                                  f"was kept, and {self._still_latest()}") from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        pointer_tmp = self.root / ".latest.tmp"
        try:
            pointer_tmp.write_text(final.name + "\n")
            os.replace(pointer_tmp, self.root / "latest")
        except OSError as exc:
            raise CheckpointError(f"checkpoint {final.name} is written in {self.root}, but its `latest` pointer could "
                                  f"not be: {write_failure(exc, self.root)}; {self._still_latest()}") from exc
        for step, path in self.steps()[:-self.keep]:
            if path != final:
                shutil.rmtree(path, ignore_errors=True)
        return final

    def _still_latest(self) -> str:
        pointer = self.root / "latest"
        name = pointer.read_text().strip() if pointer.is_file() else None
        if name is None:
            return "there is no earlier checkpoint"
        return f"the previous checkpoint {name} is the one resume=true uses"

    @staticmethod
    def load(folder: Path, learner: Learner) -> TrainState:
        """Restore ``learner`` (weights, optimizers) and the RNGs from ``folder``; return the rest.
        :class:`CheckpointError` when a file of it cannot be read (:meth:`check` first: no file is
        read into the learner from a folder that is damaged)."""
        folder = Path(folder)
        problem = Checkpointer.check(folder)
        if problem is not None:
            raise CheckpointError(f"checkpoint {folder} cannot be resumed from: {problem}")
        _check_adapters(folder / "policy.safetensors", learner.policy, "policy")
        load_model(learner.policy, str(folder / "policy.safetensors"), strict=True)
        optim = torch.load(folder / "optim.pt", weights_only=False)
        learner.policy_optimizer.load_state_dict(optim["policy"])
        if "policy_scheduler" in optim:  # checkpoints from before the policy lr schedule ran at a constant lr
            learner.policy_scheduler.load_state_dict(optim["policy_scheduler"])
        has_value = (folder / "value.safetensors").is_file()
        if has_value != (learner.value_model is not None):
            raise ValueError(f"{folder}: the checkpoint {'has' if has_value else 'has no'} value model, "
                             f"the run {'has' if learner.value_model is not None else 'has none'}; same algo?")
        if learner.value_model is not None:
            _check_adapters(folder / "value.safetensors", learner.value_model, "value model")
            load_model(learner.value_model, str(folder / "value.safetensors"), strict=True)
            learner.value_optimizer.load_state_dict(optim["value"])
            learner.value_scheduler.load_state_dict(optim["value_scheduler"])
        restore_rng(torch.load(folder / "rng.pt", weights_only=False))
        data = json.loads((folder / "state.json").read_text())
        return TrainState(int(data["step"]), int(data["version"]), int(data["pretrain_steps"]), data["source"],
                          data["algo"])


def _lora_tensors(names: Any) -> int:
    return sum(1 for n in names if ".lora_A." in n or ".lora_embedding_A." in n)


def _check_adapters(path: Path, model: torch.nn.Module, what: str) -> None:
    """A clear error when the checkpoint's LoRA adapters do not match the model's (a changed
    ``model.lora``), instead of load_model's list of missing keys."""
    with safe_open(str(path), framework="pt") as f:
        saved = _lora_tensors(f.keys())
    have = _lora_tensors(name for name, _ in model.named_parameters())
    if saved != have:
        raise ValueError(f"{path}: the checkpoint's {what} has {saved} LoRA adapter(s), this run's has {have}; "
                         "resume with the same model.lora settings")
