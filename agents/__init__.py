"""The agent loop and what it talks to: the token-in/token-out client, chat rendering, engines; and
the text loop for chat endpoints that return no token ids.

Packages: the loops (:mod:`.loop`), chat rendering (:mod:`.chat`), completion clients
(:mod:`.clients`), request routing over replicas (:mod:`.routing`), managed vLLM engines
(:mod:`.engine`), models (:mod:`.models`) and fakes for tests (:mod:`.testing`); the records, the
store, the errors and the interrupts are modules here. docs/architecture.md maps them.

Names are imported on first use (``lazy_loader.attach``, PEP 562), so that light entry points such as
``sao-model`` do not pay for the OpenAI SDK and the environments at start-up.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "chat.rendering": ["ByteTokenizer", "ChatRenderer", "Tokenizer"],
        "clients.chat": ["ChatClient", "OpenAIChatClient"],
        "clients.completions": ["CompletionClient", "OpenAICompletionClient", "RetryPolicy", "SamplingParams"],
        "errors": ["AgentError", "ContextOverflowError", "EngineError", "EngineRequestError", "EngineResponseError",
                   "EngineStartError", "EngineUnavailableError", "RenderError"],
        "loop.episodes": ["EpisodeRunner", "Renderers"],
        "loop.text_loop": ["run_text_episode"],
        "loop.token_loop": ["LoopConfig", "run_episode"],
        "records": ["ChatCompletion", "Completion", "RolloutMeta", "Segment", "Trajectory", "TurnRecord", "VersionSpan"],
    },
)
