"""Clients of an OpenAI-compatible completion server: token-in/token-out completions
(:mod:`.completions`, and vLLM's token route in :mod:`.generate`), text chat completions
(:mod:`.chat`), a scripted policy in a model's place (:mod:`.scripted`), the HTTP transport they share (:mod:`.transport`), and where an endpoint comes from:
a managed local vLLM or an external URL (:mod:`.endpoint`, probed by :mod:`.probe`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "chat": ["ChatClient", "OpenAIChatClient", "parse_chat_completion"],
        "completions": ["CompletionClient", "OpenAICompletionClient", "RetryPolicy", "SamplingParams",
                        "parse_completion"],
        "endpoint": ["ENDPOINT_MODES", "Endpoint", "open_endpoint"],
        "generate": ["GenerateClient", "generate_base_url", "parse_generate", "version_runs"],
        "probe": ["probe_mode"],
        "scripted": ["ScriptedClient", "TextPolicy"],
        "transport": ["OpenAITransport", "TransportClient", "weight_version"],
    },
)
