"""External agents: an agent from another package (or a user's own) that speaks the OpenAI chat API, run
unchanged, one task per subprocess, against the capture proxy; its records (:mod:`.task`)."""
