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
folders beyond ``keep`` are deleted after the new one is in place.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model

from sao.rl.learner import Learner

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{6,})$")


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
        pointer = self.root / "latest"
        if pointer.is_file():
            folder = self.root / pointer.read_text().strip()
            if (folder / "state.json").is_file():
                return folder
            log.warning("%s names %s, which is missing or incomplete; using the newest complete one", pointer, folder)
        complete = [p for _, p in self.steps() if (p / "state.json").is_file()]
        return complete[-1] if complete else None

    def save(self, learner: Learner, state: TrainState) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
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
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        pointer_tmp = self.root / ".latest.tmp"
        pointer_tmp.write_text(final.name + "\n")
        os.replace(pointer_tmp, self.root / "latest")
        for step, path in self.steps()[:-self.keep]:
            if path != final:
                shutil.rmtree(path, ignore_errors=True)
        return final

    @staticmethod
    def load(folder: Path, learner: Learner) -> TrainState:
        """Restore ``learner`` (weights, optimizers) and the RNGs from ``folder``; return the rest."""
        folder = Path(folder)
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
