"""The agent loop and what it talks to: the token-in/token-out client, chat rendering, engines."""

from .chat import ByteTokenizer, ChatRenderer, Tokenizer
from .client import CompletionClient, OpenAICompletionClient, RetryPolicy, SamplingParams
from .errors import (
    AgentError,
    ContextOverflowError,
    EngineError,
    EngineRequestError,
    EngineResponseError,
    EngineStartError,
    EngineUnavailableError,
    RenderError,
)
from .loop import LoopConfig, run_episode
from .records import Completion, Trajectory, TurnRecord

__all__ = [
    "AgentError", "ByteTokenizer", "ChatRenderer", "Completion", "CompletionClient", "ContextOverflowError",
    "EngineError", "EngineRequestError", "EngineResponseError", "EngineStartError", "EngineUnavailableError",
    "LoopConfig", "OpenAICompletionClient", "RenderError", "RetryPolicy", "SamplingParams", "Tokenizer",
    "Trajectory", "TurnRecord", "run_episode",
]
