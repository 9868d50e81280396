"""A :class:`~sao.agents.clients.completions.CompletionClient` whose "model" is a scripted text policy.

``policy(prompt_text) -> reply_text`` is asked with the prompt's token ids decoded (special tokens kept, so
the chat template's turn markers are visible); its reply is tokenized with the same tokenizer, ended with
the EOS token as a model ends a turn, and returned with log-prob 0.0 per token (a deterministic policy gives
its tokens probability 1). Played through the agent loop (:class:`~sao.agents.loop.episodes.EpisodeRunner`),
its episodes are what a model that wrote those replies would have produced, token for token: the prompt
rendered and every observation bridged by the loop's own renderer, the tools really run and the answer
graded by the environment. The warm start learns from such episodes (:mod:`sao.rl.warm_start`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..chat import Tokenizer
from ..records import Completion
from .completions import SamplingParams

TextPolicy = Callable[[str], str]  # the prompt, decoded with its special tokens -> the assistant's reply


class ScriptedClient:
    """Answers each request with ``policy``'s reply (module doc). ``eos_token_id``: the tokenizer's."""

    def __init__(self, tokenizer: Tokenizer, policy: TextPolicy, *, eos_token_id: int | None = None):
        self.tokenizer, self.policy = tokenizer, policy
        eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id; pass eos_token_id")
        self.eos_token_id = int(eos)
        self.requests = 0

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.requests += 1
        reply = self.policy(self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False))
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.eos_token_id]
        finish = "stop"
        if params.max_tokens is not None and len(ids) > params.max_tokens:
            ids, finish = ids[:params.max_tokens], "length"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(tuple(ids), (0.0,) * len(ids), text, finish, prompt_ids=tuple(prompt_ids))

    async def aclose(self) -> None:
        pass
