"""Token-in/token-out completions over the OpenAI API (``openai.AsyncOpenAI``).

The prompt goes out as a list of token ids on ``/v1/completions``; the answer must carry the
sampled token ids (vLLM: ``return_token_ids``) and one log-prob per sampled token. Retries,
timeouts and error mapping follow :mod:`sao.agents.errors`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import openai

from .errors import (
    ContextOverflowError,
    EngineRequestError,
    EngineResponseError,
    EngineUnavailableError,
)
from .records import Completion

log = logging.getLogger(__name__)

_CONTEXT_MARKERS = ("maximum context length", "context length", "too long", "exceeds the model", "max_model_len")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


class CompletionClient(Protocol):
    """What the agent loop needs from an engine."""

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion: ...


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 4
    backoff_s: float = 0.5  # first wait; doubles each retry, with +-25% jitter
    max_backoff_s: float = 8.0

    def delay(self, attempt: int) -> float:
        base = min(self.backoff_s * 2**attempt, self.max_backoff_s)
        return base * random.uniform(0.75, 1.25)


class OpenAICompletionClient:
    """An :class:`CompletionClient` for any OpenAI-compatible server that accepts token-id prompts."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retry: RetryPolicy = RetryPolicy(),
        max_connections: int = 256,
    ):
        self.model = model
        self.retry = retry
        self.attempts = 0  # HTTP attempts made, for metrics and tests
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=max_connections,
                                                     max_keepalive_connections=max_connections))
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
                                          max_retries=0, http_client=http)

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        last: Exception | None = None
        for attempt in range(self.retry.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.retry.delay(attempt - 1))
            self.attempts += 1
            body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": params.max_tokens,
                    "temperature": params.temperature, "top_p": params.top_p, "logprobs": 0,
                    "return_token_ids": True, "skip_special_tokens": True}
            if params.seed is not None:
                body["seed"] = params.seed
            if params.stop:
                body["stop"] = list(params.stop)
            try:
                # The SDK's typed `completions.create` walks every prompt token to transform its
                # params (CPU per request grows with the prompt); the raw post keeps its transport,
                # timeouts and error mapping without that walk.
                raw = await self._client.post("/completions", body=body, cast_to=httpx.Response)
                response = raw.json()
            except (openai.APIConnectionError, openai.InternalServerError) as exc:  # timeouts are connection errors
                last = exc
                log.warning("engine request failed (attempt %d/%d): %s", attempt + 1, self.retry.max_retries + 1, exc)
                continue
            except openai.APIStatusError as exc:
                message = _error_message(exc)
                if exc.status_code in (400, 413) and any(m in message.lower() for m in _CONTEXT_MARKERS):
                    raise ContextOverflowError(message) from exc
                if exc.status_code == 429:
                    last = exc
                    continue
                raise EngineRequestError(f"engine rejected the request ({exc.status_code}): {message}",
                                         exc.status_code) from exc
            except (openai.APIResponseValidationError, ValueError) as exc:
                raise EngineResponseError(f"malformed response: {exc}") from exc
            return parse_completion(response)
        raise EngineUnavailableError(
            f"engine unavailable after {self.retry.max_retries + 1} attempts: {type(last).__name__}: {last}"
        ) from last


def parse_completion(response: Any) -> Completion:
    """Check and convert one ``/v1/completions`` response (an SDK object or a dict)."""
    data = response.model_dump() if hasattr(response, "model_dump") else response
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise EngineResponseError(f"response has no choices: {str(data)[:300]}") from None
    token_ids = choice.get("token_ids")
    if not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
        raise EngineResponseError("response carries no `token_ids`; the server must support token-in/token-out "
                                  "(vLLM: `return_token_ids`)")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if not isinstance(logprobs, list) or len(logprobs) != len(token_ids):
        raise EngineResponseError(f"expected {len(token_ids)} token log-probs, got "
                                  f"{'none' if logprobs is None else len(logprobs)}")
    if any(not isinstance(lp, (int, float)) for lp in logprobs):
        raise EngineResponseError("a token log-prob is not a number")
    prompt_ids = choice.get("prompt_token_ids")
    return Completion(
        token_ids=tuple(token_ids),
        logprobs=tuple(float(lp) for lp in logprobs),
        text=choice.get("text") or "",
        finish_reason=choice.get("finish_reason") or "stop",
        prompt_ids=tuple(prompt_ids) if isinstance(prompt_ids, list) else None,
        weight_version=_version(data, choice),
    )


def _version(data: dict[str, Any], choice: dict[str, Any]) -> str | None:
    """The weight version, from the fields servers use to report it (none in stock vLLM ``/v1``)."""
    for source in (choice, data):
        v = source.get("weight_version")
        if v is not None:
            return str(v)
    return None


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if body.get("message"):
            return str(body["message"])
    return str(exc.message or exc)
