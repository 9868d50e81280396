"""The capture proxy: an unchanged external agent, pointed at a session's base URL, becomes a policy.

The proxy (:mod:`.proxy`) serves OpenAI's chat API per episode session (:mod:`.session`); each call is
rendered with the project's chat template and sampled on token ids (:mod:`.upstream`, :mod:`.prompts`,
tool calls parsed by vLLM's parser, :mod:`.tool_calls`), or forwarded to a hosted chat endpoint (text
mode, evaluation only). The sampling rule (:mod:`.sampling`) pins training's settings or passes an
evaluation agent's through. Every call is recorded (:mod:`.calls`), and the calls assemble into the
episode's tokens, merged where a call extends the previous one exactly and split into segments where it
does not (:mod:`.segments`). An external agent's episodes open their sessions through :mod:`.opener`. ``sao-proxy`` runs it alone (:mod:`.cli`).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "calls": ["CapturedCall"],
        "opener": ["CaptureSessions"],
        "proxy": ["CaptureProxy"],
        "requests": ["BadChatRequest", "ChatRequest"],
        "sampling": ["AgentSampling", "PinnedSampling", "SamplingChoice", "SamplingRule"],
        "segments": ["Assembled", "CaptureStats", "assemble"],
        "session": ["ProxySession"],
        "tool_calls": ["ParsedReply", "ProjectToolParser", "ToolCallParser", "VLLMToolParser", "default_tool_parser"],
        "upstream": ["TextUpstream", "TokenUpstream", "Upstream", "UpstreamAnswer"],
    },
)
