"""Chat rendering: chat templates as token ids without re-tokenization drift (:mod:`.rendering`),
and the transcript as a chat API takes it in text mode (:mod:`.history`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "history": ["NO_RESULT", "api_messages"],
        "rendering": ["ByteTokenizer", "ChatRenderer", "Tokenizer", "tool_prompt"],
    },
)
