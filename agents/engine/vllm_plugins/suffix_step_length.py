"""A vLLM general plugin (entry point group ``vllm.general_plugins``): suffix decoding honours the draft
length vLLM's scheduler chose for the step, so a per-batch-size schedule switches speculation by load.

vLLM 0.32 already picks a draft length per step from ``num_speculative_tokens_per_batch_size`` (the
number of requests scheduled -> K) and passes it to the proposer. The suffix proposer asserts that K is
its fixed maximum, so the engine died at the first step past a threshold (benchmarks/war.py, measured).
The patch calls vLLM's own ``propose`` with the proposer's maximum lowered to the step's K for the call:
drafts are only shortened (K=0: none), the prompt and response trees are still updated for every
request, and the target model still verifies every draft, so sampling and log-probs stay the target
model's. With no schedule the step's K is the maximum and nothing changes.

vLLM loads general plugins in every process it starts (API server, engine core, workers), possibly more
than once: :func:`register` is idempotent, and leaves a vLLM whose ``propose`` has another signature alone
(the assert then holds as before: a schedule crossing its threshold would fail as it did).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

log = logging.getLogger(__name__)

PATCHED = "_sao_step_draft_length"
_PARAMS = ("self", "num_speculative_tokens", "input_batch", "sampled_token_ids")


def honour_step_length(cls: type) -> bool:
    """Patch ``cls.propose`` (vLLM's ``SuffixDecodingProposer``) to draft at most the step's K. True when
    ``cls`` is patched (now or before), False when its ``propose`` is not the one this was written for."""
    if getattr(cls, PATCHED, False):
        return True
    original = cls.propose
    if tuple(inspect.signature(original).parameters)[:len(_PARAMS)] != _PARAMS:
        log.warning("sao plugin: %s.propose has an unknown signature; suffix drafts keep a fixed length",
                    cls.__name__)
        return False

    def propose(self: Any, num_speculative_tokens: int, input_batch: Any, sampled_token_ids: Any,
                *args: Any, **kwargs: Any) -> list[list[int]]:
        full = self.num_speculative_tokens
        k = max(0, min(int(num_speculative_tokens), full))
        self.num_speculative_tokens = k  # vLLM's body drafts at most this many, and asserts it was passed
        try:
            return original(self, k, input_batch, sampled_token_ids, *args, **kwargs)
        finally:
            self.num_speculative_tokens = full

    propose.__doc__, propose.__wrapped__ = original.__doc__, original  # type: ignore[attr-defined]
    cls.propose = propose
    setattr(cls, PATCHED, True)
    return True


def register() -> None:
    """The entry point vLLM calls: patch the suffix proposer if this vLLM has one."""
    try:
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer
    except Exception:  # noqa: BLE001  (a vLLM without suffix decoding: nothing to patch)
        return
    honour_step_length(SuffixDecodingProposer)
