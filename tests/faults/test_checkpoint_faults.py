"""Checkpoints under faults, with a tiny model (seconds): a full disk while one is written, and a
truncated file in one.

- Full disk: the write fails with :class:`CheckpointError`, one line that says "no space left on
  device", how much is free and which checkpoint ``latest`` still names; nothing of the failed one is
  left; the previous one loads. On a real full file system (a tmpfs, root only) and, everywhere, with
  the writer made to raise ENOSPC. ``sao-train``'s own message and exit status on a full disk:
  ``test_train_faults.py``.
- Truncated file: the checkpoint is skipped with a warning that names it and the file, and the previous
  one is used (``Checkpointer.latest``); a damaged folder is never read into the learner; with no readable
  checkpoint, resuming is refused. A run resumed over a truncated latest checkpoint completes with every
  step once (fake engine).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from sao.agents.testing.fake_server import FakeServer
from sao.rl.config import TrainConfig
from sao.rl.learner.learner import Learner
from sao.rl.training.build import learner_config
from sao.rl.training.checkpoint import Checkpointer, CheckpointError, TrainState
from sao.rl.weights.sync import save_checkpoint
from tests.faults.procs import fill, jsonl, tmpfs
from tests.test_train import config, make_trainer, responder
from tests.tiny_models import tiny_llama


def tiny_learner() -> Learner:
    """A tiny policy after one AdamW step: its optimizer file (two moments) is twice the policy's."""
    learner = Learner(tiny_llama(vocab=512), learner_config(TrainConfig()), value_model=None)
    for p in learner.policy.parameters():
        p.grad = torch.ones_like(p)
    learner.policy_optimizer.step()
    learner.policy_optimizer.zero_grad(set_to_none=True)
    return learner


def weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.policy.state_dict().items()}


def nudge(learner: Learner) -> None:
    with torch.no_grad():
        for p in learner.policy.parameters():
            p.add_(0.5)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def state(step: int) -> TrainState:
    return TrainState(step, step, 0, {"tasks": {"cursor": step}}, {})


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


# the space left for the second checkpoint, as a share of one: its policy file does not fit (safetensors'
# error), or it does and the optimizer's does not (torch.save's)
@pytest.mark.parametrize(("room", "writer_error"), [(0.15, "SafetensorError"), (0.6, "RuntimeError")])
def test_a_full_file_system_fails_the_checkpoint_cleanly_and_keeps_the_previous_one(room: float, writer_error: str,
                                                                                    tmp_path: Path) -> None:
    learner = tiny_learner()
    with tmpfs(tmp_path / "fs", "16m") as root:
        ck = Checkpointer(root / "checkpoints", keep=2)
        first = ck.save(learner, state(1))
        saved = weights(learner)
        nudge(learner)
        fill(root / "ballast", leave=int(folder_size(first) * room))  # the file system, full but for `room`

        with pytest.raises(CheckpointError) as failed:
            ck.save(learner, state(2))
        message = str(failed.value)
        assert type(failed.value.__cause__).__name__ == writer_error  # the file the disk filled up in
        assert "\n" not in message and "no space left on device" in message, message
        assert "step_000002" in message and "step_000001" in message and "MiB free" in message, message
        assert [p.name for p in ck.root.iterdir() if p.name.startswith(".tmp")] == []  # the partial write is gone
        assert ck.latest() == first

        with pytest.raises(CheckpointError, match="could not write weights version 2 .*no space left on device"):
            save_checkpoint(learner.policy, root / "weights", 2, dtype=torch.float32)
        assert not any(p.name.startswith(".tmp") for p in (root / "weights").iterdir())

        loaded = ck.load(ck.latest(), learner)  # the previous checkpoint loads, whole
        assert loaded.step == 1 and loaded.source == {"tasks": {"cursor": 1}}
        assert same(weights(learner), saved)

        (root / "ballast").unlink()  # space again: the same save succeeds
        nudge(learner)
        assert ck.save(learner, state(2)).name == "step_000002" and ck.latest().name == "step_000002"


def test_a_writer_that_raises_enospc_gives_one_line_and_keeps_the_previous_checkpoint(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """The same without root: the policy's writer raises ENOSPC (what the OS says for a full disk)."""
    import sao.rl.training.checkpoint as checkpoint

    learner = tiny_learner()
    ck = Checkpointer(tmp_path, keep=2)
    ck.save(learner, state(1))
    saved = weights(learner)

    def full(model, filename):  # type: ignore[no-untyped-def]
        Path(filename).write_bytes(b"\0" * 1000)  # part of the file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(checkpoint, "save_model", full)
    nudge(learner)
    with pytest.raises(CheckpointError) as failed:
        ck.save(learner, state(2))
    message = str(failed.value)
    assert "\n" not in message and "could not write checkpoint step_000002" in message
    assert "no space left on device" in message and "step_000001 is the one resume=true uses" in message
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("step_000001")] == ["latest"]
    assert ck.load(ck.latest(), learner).step == 1 and same(weights(learner), saved)


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


@pytest.mark.parametrize("damaged", ["policy.safetensors", "optim.pt", "rng.pt", "state.json"])
def test_a_truncated_checkpoint_is_skipped_for_the_previous_one(damaged: str, tmp_path: Path, caplog) -> None:
    learner = tiny_learner()
    ck = Checkpointer(tmp_path, keep=2)
    ck.save(learner, state(1))
    first = weights(learner)
    nudge(learner)
    second = ck.save(learner, state(2))
    now = weights(learner)
    truncate(second / damaged)

    assert damaged in (ck.check(second) or "")
    with pytest.raises(CheckpointError, match=f"step_000002 cannot be resumed from: {damaged}"):
        ck.load(second, learner)
    assert same(weights(learner), now)  # refused before anything was read into the learner

    with caplog.at_level(logging.WARNING, logger="sao.rl.training.checkpoint"):
        chosen = ck.latest()
    assert chosen is not None and chosen.name == "step_000001"
    assert f"step_000002: {damaged}" in caplog.text and "resuming from step_000001" in caplog.text
    assert ck.load(chosen, learner).step == 1 and same(weights(learner), first)


def test_no_readable_checkpoint_refuses_to_resume(tmp_path: Path) -> None:
    learner = tiny_learner()
    ck = Checkpointer(tmp_path, keep=2)
    for step in (1, 2):
        truncate(ck.save(learner, state(step)) / "policy.safetensors")
    with pytest.raises(CheckpointError) as refused:
        ck.latest()
    message = str(refused.value)
    assert "no readable checkpoint" in message and "step_000001: policy.safetensors" in message
    assert "step_000002: policy.safetensors" in message and "\n" not in message


def test_a_run_resumed_over_a_truncated_checkpoint_redoes_the_steps_after_the_previous_one(tmp_path: Path) -> None:
    """The trainer with the scripted engine: 2 steps, step 2's optimizer file cut in half, resume to 3. The
    run falls back to step 1, drops what was logged after it, and ends with every step's batch once."""
    with FakeServer(responder=responder) as server:
        asyncio.run(make_trainer(config("grpo", max_steps=2), tmp_path, server, _engine()).run())
        truncate(tmp_path / "checkpoints" / "step_000002" / "optim.pt")
        resumed = make_trainer(config("grpo", max_steps=3, resume=True), tmp_path, server, _engine())
        asyncio.run(resumed.run())
    assert [r["step"] for r in jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    steps = [t["rollout"]["train_step"] for t in jsonl(tmp_path / "trajectories.jsonl")]
    assert sorted(steps) == [1] * 4 + [2] * 4 + [3] * 4
    batches = jsonl(tmp_path / "batches.jsonl")
    assert [b["step"] for b in batches] == [1, 2, 3]
    prompts = [e["prompt_index"] for b in batches for e in b["episodes"]]
    assert sorted(prompts) == [i for i in range(6) for _ in range(2)]  # 2 samples of 2 prompts a step, none twice
    assert Checkpointer(tmp_path / "checkpoints").latest().name == "step_000003"
    shutil.rmtree(tmp_path, ignore_errors=True)


def _engine():  # type: ignore[no-untyped-def]
    from tests.test_train import FakeEngine

    return FakeEngine()
