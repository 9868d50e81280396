"""JSON over HTTP to an OpenAI-compatible server, with the retries and error mapping of :mod:`..errors`.

Both clients (token completions in :mod:`.completions`, chat completions in :mod:`.chat`) post
through one :class:`OpenAITransport`, so a retry or error-mapping fix lands in one place:

* connection errors, timeouts, HTTP 5xx and 429 are retried with :class:`RetryPolicy`'s backoff,
  then raised as :class:`EngineUnavailableError`;
* a 400/413 that says the prompt is too long is :class:`ContextOverflowError` (not retried);
* any other 4xx is :class:`EngineRequestError` (not retried);
* a body that is not JSON is :class:`EngineResponseError` (not retried).
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from ..errors import ContextOverflowError, EngineRequestError, EngineResponseError, EngineUnavailableError

log = logging.getLogger(__name__)

_CONTEXT_MARKERS = ("maximum context length", "context length", "too long", "exceeds the model", "max_model_len")


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 4
    backoff_s: float = 0.5  # first wait; doubles each retry, with +-25% jitter
    max_backoff_s: float = 8.0

    def delay(self, attempt: int) -> float:
        base = min(self.backoff_s * 2**attempt, self.max_backoff_s)
        return base * random.uniform(0.75, 1.25)


@dataclass(frozen=True)
class Answer:
    """One request's decoded JSON body, and the HTTP attempts it took (retries included)."""

    data: Any
    attempts: int


class OpenAITransport:
    """POSTs JSON bodies to one server and returns the decoded answers; counts HTTP ``attempts``
    (all requests together; each :class:`Answer` carries its own request's)."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout_s: float = 600.0,
                 retry: RetryPolicy = RetryPolicy(), max_connections: int = 256):
        self.retry = retry
        self.attempts = 0  # HTTP attempts made, for metrics and tests
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=max_connections,
                                                     max_keepalive_connections=max_connections))
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
                                          max_retries=0, http_client=http)

    async def aclose(self) -> None:
        await self._client.close()

    async def post(self, path: str, body: dict[str, Any]) -> Answer:
        last: Exception | None = None
        for attempt in range(self.retry.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.retry.delay(attempt - 1))
            self.attempts += 1
            try:
                # The SDK's typed `create` methods walk every prompt token to transform their params
                # (CPU per request grows with the prompt); the raw post keeps the SDK's transport,
                # timeouts and error mapping without that walk.
                raw = await self._client.post(path, body=body, cast_to=httpx.Response)
                return Answer(raw.json(), attempt + 1)
            except (openai.APIConnectionError, openai.InternalServerError) as exc:  # timeouts are connection errors
                last = exc
                log.warning("engine request failed (attempt %d/%d): %s", attempt + 1, self.retry.max_retries + 1, exc)
                continue
            except openai.APIStatusError as exc:
                message = error_message(exc)
                if exc.status_code in (400, 413) and any(m in message.lower() for m in _CONTEXT_MARKERS):
                    raise ContextOverflowError(message) from exc
                if exc.status_code == 429:
                    last = exc
                    continue
                raise EngineRequestError(f"engine rejected the request ({exc.status_code}): {message}",
                                         exc.status_code) from exc
            except (openai.APIResponseValidationError, ValueError) as exc:
                raise EngineResponseError(f"malformed response: {exc}") from exc
        raise EngineUnavailableError(
            f"engine unavailable after {self.retry.max_retries + 1} attempts: {type(last).__name__}: {last}"
        ) from last


def weight_version(data: dict[str, Any], choice: dict[str, Any]) -> str | None:
    """The weight version, from the fields servers use to report it (none in stock vLLM ``/v1``)."""
    for source in (choice, data):
        v = source.get("weight_version")
        if v is not None:
            return str(v)
    return None


def error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if body.get("message"):
            return str(body["message"])
    return str(exc.message or exc)


class TransportClient:
    """What both clients share: the served model's name and one :class:`OpenAITransport`."""

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
        self._http = OpenAITransport(base_url, api_key=api_key, timeout_s=timeout_s, retry=retry,
                                     max_connections=max_connections)

    @property
    def attempts(self) -> int:
        """HTTP attempts made, for metrics and tests."""
        return self._http.attempts

    async def aclose(self) -> None:
        await self._http.aclose()
