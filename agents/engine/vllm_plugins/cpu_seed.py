"""A vLLM general plugin (entry point group ``vllm.general_plugins``): seeded requests survive chunked
prefill on vLLM's CPU backend.

When a prompt is prefilled in several chunks, vLLM samples a token after every chunk and throws away all
but the last; for a seeded request it then rewinds the request's generator by the draw it wasted
(``gen.set_offset(gen.get_offset() - 4)`` in ``GPUModelRunner._bookkeeping_sync``), so that the seed
gives the same tokens however the prompt was chunked. That works for CUDA's Philox generators. A CPU
generator (Mersenne Twister) has no offset: ``RuntimeError: CPU Generator does not use offset`` kills the
engine. The agent loop seeds every turn, so a long prompt arriving while others are in flight (64
``beyond-aime`` episodes at once: dead within 20 s, ``benchmarks/soak.py``) takes the engine down.

The patch, on ``CPUModelRunner.sample_tokens`` only: the generators of the requests whose token this
step will throw away are taken out of the batch's generator map for the call (their throw-away token is
drawn from the global generator, as an unseeded request's would be, and the rewind has nothing to
rewind), and put back afterwards with the state they had before the call. A seeded request's stream then
advances only with the tokens it keeps, the same rule the CUDA rewind implements.

vLLM loads general plugins in every process it starts, possibly more than once: :func:`register` is
idempotent and leaves alone a vLLM without a CPU runner or whose runner lacks the attributes used here.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

PATCHED = "_sao_cpu_seeded_chunks"


def held_out(runner: Any) -> dict[int, Any]:
    """Take the CPU generators of the requests whose sampled token this step discards out of
    ``runner.input_batch.generators``; returns ``{index: (generator, state)}`` to put back."""
    batch = runner.input_batch
    n = batch.num_reqs
    held: dict[int, Any] = {}
    for i in np.nonzero(runner.discard_request_mask.np[:n])[0]:
        gen = batch.generators.get(int(i))
        if gen is not None and gen.device.type == "cpu":
            held[int(i)] = (batch.generators.pop(int(i)), gen.get_state())
    return held


def put_back(runner: Any, held: dict[int, Any]) -> None:
    """Undo :func:`held_out`: each generator back under its index, with its state from before."""
    for i, (gen, state) in held.items():
        gen.set_state(state)
        runner.input_batch.generators[i] = gen


def keep_seeded_streams(cls: type) -> bool:
    """Patch ``cls.sample_tokens`` (vLLM's ``CPUModelRunner``). True when patched (now or before)."""
    if getattr(cls, PATCHED, False):
        return True
    original = cls.sample_tokens

    def sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "execute_model_state", None) is None:  # nothing sampled this call
            return original(self, *args, **kwargs)
        held = held_out(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            put_back(self, held)

    sample_tokens.__doc__, sample_tokens.__wrapped__ = original.__doc__, original  # type: ignore[attr-defined]
    cls.sample_tokens = sample_tokens
    setattr(cls, PATCHED, True)
    return True


def register() -> None:
    """The entry point vLLM calls: patch the CPU model runner if this vLLM has one."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():  # CUDA generators rewind by offset: nothing to patch
            return
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except Exception:  # noqa: BLE001  (a vLLM without the CPU backend: nothing to patch)
        return
    needed = ("sample_tokens", "_bookkeeping_sync")
    if not all(hasattr(CPUModelRunner, name) for name in needed):
        log.warning("sao plugin: vLLM's CPUModelRunner lacks %s; seeded chunked prefill is left as it is", needed)
        return
    keep_seeded_streams(CPUModelRunner)
