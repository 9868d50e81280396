"""Which route an external endpoint supports: token-in/token-out, or chat only.

One request: a 1-token completion of a text prompt on ``/v1/completions`` asking for token ids and
log-probs (vLLM: ``return_token_ids``). An answer that carries both means the token loop can run
("tokens"); any other answer (the route refused with a 4xx, as hosted chat models do, or an answer
without token ids or log-probs) means the chat route ("chat"). Transport trouble and 5xx/429 are
retried with the clients' :class:`~sao.agents.clients.transport.RetryPolicy` and then raised: an endpoint
that does not answer is not a chat endpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import EngineUnavailableError
from .transport import RetryPolicy

PROBE_PROMPT = "Hello"


@dataclass(frozen=True)
class ModeChoice:
    mode: str  # "tokens" | "chat"
    reason: str


def probe_mode(base_url: str, model: str, api_key: str | None = None, *, timeout_s: float = 60.0,
               retry: RetryPolicy = RetryPolicy()) -> ModeChoice:
    """Send the probe to ``base_url`` (".../v1") and say which mode its answer allows, and why."""
    url = base_url.rstrip("/") + "/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0.0, "logprobs": 0,
            "return_token_ids": True}
    last = ""
    for attempt in range(retry.max_retries + 1):
        if attempt:
            time.sleep(retry.delay(attempt - 1))
        try:
            r = httpx.post(url, json=body, headers=headers, timeout=timeout_s)
        except httpx.TransportError as exc:
            last = f"{type(exc).__name__}: {exc}"
            continue
        if r.status_code >= 500 or r.status_code == 429:
            last = f"HTTP {r.status_code}: {r.text[:200]}"
            continue
        if r.status_code != 200:
            return ModeChoice("chat", f"/v1/completions answered HTTP {r.status_code} ({_message(r)})")
        try:
            data = r.json()
        except ValueError:
            return ModeChoice("chat", f"/v1/completions answered with a body that is not JSON: {r.text[:100]!r}")
        return _judge(data)
    raise EngineUnavailableError(f"cannot probe {url} after {retry.max_retries + 1} attempts: {last}")


def _judge(data: Any) -> ModeChoice:
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError):
        return ModeChoice("chat", "the /v1/completions answer has no choices")
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        return ModeChoice("chat", "the /v1/completions answer carries no token ids")
    lp = choice.get("logprobs")
    logprobs = lp.get("token_logprobs") if isinstance(lp, dict) else None
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        return ModeChoice("chat", "the /v1/completions answer carries token ids but no token log-probs")
    return ModeChoice("tokens", "the /v1/completions answer carries token ids and log-probs")


def _message(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:200]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])[:200]
    return str(body)[:200]
