"""Where models come from: aliases prepared into Hugging Face checkpoints and names resolved
(:mod:`.prepare`), and ``sao-model`` (:mod:`.cli`)."""
