"""Which prompts a run sees: the deterministic, resumable task stream (:mod:`.tasks`), the curriculum
of online learning (:mod:`.curriculum`), and the prompts admitted but not yet trained (:mod:`.open_prompts`)."""
