"""The agent loop and what it talks to: the token-in/token-out client, chat rendering, engines; and
the text loop for chat endpoints that return no token ids.

Names are imported on first use (PEP 562), so that light entry points such as ``sao-model``
do not pay for the OpenAI SDK and the environments at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    ".chat.rendering": ("ByteTokenizer", "ChatRenderer", "Tokenizer"),
    ".clients.chat": ("ChatClient", "OpenAIChatClient"),
    ".clients.completions": ("CompletionClient", "OpenAICompletionClient", "RetryPolicy", "SamplingParams"),
    ".loop.episodes": ("EpisodeRunner", "Renderers"),
    ".errors": ("AgentError", "ContextOverflowError", "EngineError", "EngineRequestError", "EngineResponseError",
                "EngineStartError", "EngineUnavailableError", "RenderError"),
    ".loop.token_loop": ("LoopConfig", "run_episode"),
    ".records": ("ChatCompletion", "Completion", "RolloutMeta", "Trajectory", "TurnRecord", "VersionSpan"),
    ".loop.text_loop": ("run_text_episode",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
