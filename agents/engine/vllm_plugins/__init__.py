"""vLLM general plug-ins (entry point group ``vllm.general_plugins``, named in pyproject.toml),
loaded by vLLM in every process it starts: suffix decoding honours the step's draft length
(:mod:`.suffix_step_length`), and seeded requests survive chunked prefill on the CPU (:mod:`.cpu_seed`)."""
