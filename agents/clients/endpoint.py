"""Where completions come from: a managed local vLLM, or any external OpenAI-compatible endpoint.

An endpoint runs in one of two modes. ``tokens``: token-in/token-out on ``/v1/completions`` (the
agent loop; needs the model's tokenizer). ``chat``: ``/v1/chat/completions`` with text messages (the
text loop; for endpoints that return no token ids, as hosted APIs do; needs no tokenizer, and its
trajectories are not trainable). ``auto`` probes an external endpoint once (:mod:`.probe`); a
managed vLLM always runs in ``tokens`` mode.

The context window (``max_model_len``): given, it is what a managed vLLM is started with. Not given
(None), a managed vLLM is started without ``--max-model-len`` and so takes the model's own
(``max_position_embeddings`` of its ``config.json``, as vLLM derives it); the endpoint then holds what
the server reports in ``/v1/models``. An external endpoint's is what it reports there, else the
given one, else the model's ``config.json`` when it is local, else :data:`UNKNOWN_CONTEXT` (with a
warning in tokens mode, where the loop counts on it).
"""

from __future__ import annotations

import contextlib
import json
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
UNKNOWN_CONTEXT = 4096  # an external endpoint that reports no context, for a model without a local config
# config.json keys that give a model's context, in vLLM's order (vllm.config.model._get_and_verify_max_len)
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                 "max_seq_length", "seq_len")


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
    max_model_len: int | None = None,
    log_path: Path | None = None,
    startup_timeout_s: float = 600.0,
    mode: str = "tokens",
    speculative: SpeculativeConfig | None = None,
) -> Iterator[Endpoint]:
    """Yield an :class:`Endpoint`; a managed server is stopped on exit, whatever happened.

    ``mode`` is one of :data:`ENDPOINT_MODES`. In chat mode no tokenizer is looked up or downloaded.
    ``max_model_len``: the context window; None: the model's own (module doc).
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
        # chat mode: not used by the text loop (context_left is not known there), so no warning
        context = reported or max_model_len or model_context(local) or (
            _unknown_context(base_url) if mode == "tokens" else UNKNOWN_CONTEXT)
        yield Endpoint(base_url.rstrip("/"), model, local, context, api_key, managed=False, mode=mode)
        return
    if mode == "chat":
        raise ValueError("chat mode is for external endpoints (give a base URL); a local vLLM runs in tokens mode")

    from ..engine.fleet import cpu_share
    from ..engine.server import VLLMServer, VLLMServerConfig
    from ..models.prepare import ensure_model

    path = ensure_model(model)
    # one replica on a small CPU machine computes on all its cores, as sao-train's (cpu_share); vLLM's own
    # choice reserves one of 2 for its front-end
    config = VLLMServerConfig(model=path, served_model_name=model, max_model_len=max_model_len,
                              log_path=log_path, startup_timeout_s=startup_timeout_s, speculative=speculative,
                              env=cpu_share(0, 1))
    with VLLMServer(config) as server:
        context = max_model_len or served_context(server.base_url, model, path)
        yield Endpoint(server.base_url, model, tokenizer or path, context, None, managed=True, server=server)


def served_context(base_url: str, model: str, path: str) -> int:
    """The context a managed vLLM started without ``--max-model-len`` took: what it reports in
    ``/v1/models``, else the model's ``config.json`` (what vLLM derives it from)."""
    try:
        reported = _served_max_len(base_url, None, model)
    except EngineError as exc:
        log.warning("%s; the context is read from the model's config.json instead", exc)
        reported = None
    return reported or model_context(path) or _unknown_context(base_url)


def model_context(path: str | None) -> int | None:
    """The context window in a local model directory's ``config.json`` (or its ``text_config``); None
    when there is no such file or key."""
    if path is None or not (Path(path) / "config.json").is_file():
        return None
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for node in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            if isinstance(node.get(key), int) and node[key] > 0:
                return node[key]
    return None


def _unknown_context(base_url: str) -> int:
    log.warning("the context window of %s is not known (not in /v1/models, no local config.json); %d is assumed: "
                "pass --max-model-len", base_url, UNKNOWN_CONTEXT)
    return UNKNOWN_CONTEXT


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
