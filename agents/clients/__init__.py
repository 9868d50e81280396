"""Clients of an OpenAI-compatible completion server: token-in/token-out completions
(:mod:`.completions`, and vLLM's token route in :mod:`.generate`), text chat completions
(:mod:`.chat`), the HTTP transport they share (:mod:`.transport`), and where an endpoint comes from:
a managed local vLLM or an external URL (:mod:`.endpoint`, probed by :mod:`.probe`)."""
