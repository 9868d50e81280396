"""Chat rendering: chat templates as token ids without re-tokenization drift (:mod:`.rendering`),
and the transcript as a chat API takes it in text mode (:mod:`.history`)."""
