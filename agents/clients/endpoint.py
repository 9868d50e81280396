"""Where completions come from: a managed local vLLM, or any external OpenAI-compatible endpoint.

An endpoint runs in one of two modes. ``tokens``: token-in/token-out on ``/v1/completions`` (the
agent loop; needs the model's tokenizer). ``chat``: ``/v1/chat/completions`` with text messages (the
text loop; for endpoints that return no token ids, as hosted APIs do; needs no tokenizer, and its
trajectories are not trainable). ``auto`` probes an external endpoint once (:mod:`.probe`); a
managed vLLM always runs in ``tokens`` mode.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from ..engine import SpeculativeConfig
from ..errors import EngineError
from .probe import probe_mode

if TYPE_CHECKING:
    from ..engine import VLLMServer

log = logging.getLogger(__name__)


ENDPOINT_MODES = ("auto", "tokens", "chat")


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # ".../v1"
    model: str  # the name to put in requests
    tokenizer: str | None  # a local directory or Hugging Face id to load the tokenizer from; None in chat mode
    max_model_len: int
    api_key: str | None = None
    managed: bool = False
    mode: str = "tokens"  # "tokens" | "chat" (resolved; never "auto")
    server: VLLMServer | None = field(default=None, compare=False, repr=False)  # the managed one, to watch


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
    mode: str = "tokens",
    speculative: SpeculativeConfig | None = None,
) -> Iterator[Endpoint]:
    """Yield an :class:`Endpoint`; a managed server is stopped on exit, whatever happened.

    ``mode`` is one of :data:`ENDPOINT_MODES`. In chat mode no tokenizer is looked up or downloaded.
    ``speculative``: how a managed server speculates (an external one was started with its own flags).
    """
    if mode not in ENDPOINT_MODES:
        raise ValueError(f"endpoint mode must be one of {ENDPOINT_MODES}, got {mode!r}")
    speculative = speculative or SpeculativeConfig()
    if base_url is not None and speculative.enabled:
        raise ValueError("speculative decoding is set when a local vLLM starts; a server at a base URL was started "
                         "with its own --speculative-config")
    if base_url is not None:
        reported = _served_max_len(base_url, api_key, model)
        if mode == "auto":
            choice = probe_mode(base_url, model, api_key)
            mode = choice.mode
            log.log(logging.WARNING if mode == "chat" else logging.INFO, "endpoint %s: %s mode, because %s%s",
                    base_url, mode, choice.reason, "; its trajectories are text only, not trainable" if mode == "chat" else "")
        else:
            log.info("endpoint %s: %s mode, as asked", base_url, mode)
        local = _tokenizer_source(tokenizer or model) if mode == "tokens" else None
        yield Endpoint(base_url.rstrip("/"), model, local, reported or max_model_len, api_key, managed=False, mode=mode)
        return
    if mode == "chat":
        raise ValueError("chat mode is for external endpoints (give a base URL); a local vLLM runs in tokens mode")

    from ..engine.server import VLLMServer, VLLMServerConfig
    from ..models.prepare import ensure_model

    path = ensure_model(model)
    config = VLLMServerConfig(model=path, served_model_name=model, max_model_len=max_model_len,
                              log_path=log_path, startup_timeout_s=startup_timeout_s, speculative=speculative)
    with VLLMServer(config) as server:
        yield Endpoint(server.base_url, model, tokenizer or path, max_model_len, None, managed=True, server=server)


def _tokenizer_source(name: str) -> str:
    """A local directory for ``name`` when one can be had, else ``name`` itself (an HF id)."""
    from ..models.prepare import ensure_model

    try:
        return ensure_model(name)
    except Exception as exc:  # noqa: BLE001 - an HF id we cannot resolve here is passed on as is
        log.debug("tokenizer %r not resolved locally: %s", name, exc)
        return name


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
