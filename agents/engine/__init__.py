"""Managed vLLM engines: the server process (:mod:`.server`), the client of its control endpoints
(:mod:`.control`), its ``/metrics`` (:mod:`.metrics`, read window by window by :mod:`.meter`), a
watch that restarts it (:mod:`.watch`), several replicas of one model (:mod:`.fleet`), speculative
decoding (:mod:`.speculative`), and the vLLM plug-ins this package installs (:mod:`.vllm_plugins`)."""
