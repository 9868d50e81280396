"""Where completions come from: a managed local vLLM, or any external OpenAI-compatible endpoint."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from .errors import EngineError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # ".../v1"
    model: str  # the name to put in requests
    tokenizer: str  # a local directory or Hugging Face id to load the tokenizer from
    max_model_len: int
    api_key: str | None = None
    managed: bool = False


@contextlib.contextmanager
def open_endpoint(
    model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    tokenizer: str | None = None,
    max_model_len: int = 4096,
    log_path: Path | None = None,
    startup_timeout_s: float = 600.0,
) -> Iterator[Endpoint]:
    """Yield an :class:`Endpoint`; a managed server is stopped on exit, whatever happened."""
    from .model import ensure_model

    if base_url is not None:
        local = tokenizer or model
        try:
            local = ensure_model(local)
        except Exception as exc:  # noqa: BLE001 - an HF id we cannot resolve here is passed on as is
            log.debug("tokenizer %r not resolved locally: %s", local, exc)
        reported = _served_max_len(base_url, api_key, model)
        yield Endpoint(base_url.rstrip("/"), model, local, reported or max_model_len, api_key, managed=False)
        return

    from .engine import VLLMServer, VLLMServerConfig

    path = ensure_model(model)
    config = VLLMServerConfig(model=path, served_model_name=model, max_model_len=max_model_len,
                              log_path=log_path, startup_timeout_s=startup_timeout_s)
    with VLLMServer(config) as server:
        yield Endpoint(server.base_url, model, tokenizer or path, max_model_len, None, managed=True)


def _served_max_len(base_url: str, api_key: str | None, model: str) -> int | None:
    """vLLM lists ``max_model_len`` in ``/v1/models``; other servers may not."""
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        r = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=10)
        r.raise_for_status()
        for card in r.json().get("data", []):
            if card.get("id") == model and card.get("max_model_len"):
                return int(card["max_model_len"])
    except (httpx.HTTPError, ValueError) as exc:
        raise EngineError(f"cannot reach the endpoint {base_url}: {exc}") from exc
    return None
