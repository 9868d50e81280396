"""Token-in/token-out completions over the OpenAI API (``openai.AsyncOpenAI``).

The prompt goes out as a list of token ids on ``/v1/completions``; the answer must carry the
sampled token ids (vLLM: ``return_token_ids``) and one log-prob per sampled token. Retries,
timeouts and error mapping are :mod:`.transport`'s (:mod:`sao.agents.errors` describes the model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..errors import EngineResponseError
from ..records import Completion
from .transport import RetryPolicy, TransportClient, weight_version

__all__ = ["CompletionClient", "OpenAICompletionClient", "RetryPolicy", "SamplingParams", "parse_completion"]


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings. The optional ones (``top_k`` to ``repetition_penalty``) are sent
    only when set: unset, vLLM fills them from the model's ``generation_config``. The capture proxy's
    training rule sets them to the neutral values (``top_k=-1``, ``min_p=0``, no penalties) so that the
    engine samples from the plain tempered distribution the learner assumes (sao.agents.capture.sampling)."""

    max_tokens: int | None  # None: not sent, the server's context bounds the answer (chat; never the token loop)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int | None = None  # -1: all tokens
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # 1.0: none

    def optional_fields(self) -> dict[str, Any]:
        """The optional settings that are set, by their API names."""
        return {name: getattr(self, name) for name in OPTIONAL_FIELDS if getattr(self, name) is not None}


OPTIONAL_FIELDS = ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


class CompletionClient(Protocol):
    """What the agent loop needs from an engine."""

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion: ...


class OpenAICompletionClient(TransportClient):
    """An :class:`CompletionClient` for any OpenAI-compatible server that accepts token-id prompts."""

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        body = {"model": self.model, "prompt": list(prompt_ids), **sampling_fields(params), "return_token_ids": True}
        answer = await self._http.post("/completions", body)
        return replace(parse_completion(answer.data), attempts=answer.attempts)


def sampling_fields(params: SamplingParams) -> dict[str, Any]:
    """vLLM's sampling fields for ``params``, one sampled-token log-prob each (the completions body's, and
    the token route's ``sampling_params``)."""
    out: dict[str, Any] = {"max_tokens": params.max_tokens, "temperature": params.temperature,
                           "top_p": params.top_p, "logprobs": 0, "skip_special_tokens": True}
    if params.max_tokens is None:
        del out["max_tokens"]
    if params.seed is not None:
        out["seed"] = params.seed
    if params.stop:
        out["stop"] = list(params.stop)
    out.update(params.optional_fields())
    return out


def first_choice(response: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(body, its first choice) of a response (an SDK object or a dict), or EngineResponseError."""
    data = response.model_dump() if hasattr(response, "model_dump") else response
    try:
        return data, data["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise EngineResponseError(f"response has no choices: {str(data)[:300]}") from None


def sampled_token_ids(choice: dict[str, Any], missing: str) -> list[int]:
    """The choice's ``token_ids``, or EngineResponseError(``missing``)."""
    token_ids = choice.get("token_ids")
    if not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
        raise EngineResponseError(missing)
    return token_ids


def check_count(logprobs: Any, tokens: int) -> list[Any]:
    """``logprobs`` when it is a list of one entry per sampled token, else EngineResponseError."""
    if not isinstance(logprobs, list) or len(logprobs) != tokens:
        raise EngineResponseError(f"expected {tokens} token log-probs, got "
                                  f"{'none' if logprobs is None else len(logprobs)}")
    return logprobs


def parse_completion(response: Any) -> Completion:
    """Check and convert one ``/v1/completions`` response (an SDK object or a dict)."""
    data, choice = first_choice(response)
    token_ids = sampled_token_ids(choice, "response carries no `token_ids`; the server must support token-in/"
                                          "token-out (vLLM: `return_token_ids`); sao-eval runs endpoints without "
                                          "them with `--endpoint-mode chat`")
    logprobs = check_count((choice.get("logprobs") or {}).get("token_logprobs"), len(token_ids))
    if any(not isinstance(lp, (int, float)) for lp in logprobs):
        raise EngineResponseError("a token log-prob is not a number")
    prompt_ids = choice.get("prompt_token_ids")
    return Completion(
        token_ids=tuple(token_ids),
        logprobs=tuple(float(lp) for lp in logprobs),
        text=choice.get("text") or "",
        finish_reason=choice.get("finish_reason") or "stop",
        prompt_ids=tuple(prompt_ids) if isinstance(prompt_ids, list) else None,
        weight_version=weight_version(data, choice),
    )
