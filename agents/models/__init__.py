"""Where models come from: aliases prepared into Hugging Face checkpoints and names resolved
(:mod:`.prepare`), and ``sao-model`` (:mod:`.cli`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "prepare": ["MODELS", "ModelError", "ensure_model", "is_prepared", "prepare_model", "resolve_model",
                    "sao_home"],
    },
)
