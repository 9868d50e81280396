"""Managed vLLM engines: the server process (:mod:`.server`), the client of its control endpoints
(:mod:`.control`), its ``/metrics`` (:mod:`.metrics`, read window by window by :mod:`.meter`), a
watch that restarts it (:mod:`.watch`), several replicas of one model (:mod:`.fleet`), speculative
decoding (:mod:`.speculative`), and the vLLM plug-ins this package installs (:mod:`.vllm_plugins`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "control": ["EngineClient", "PauseMode"],
        "fleet": ["cpu_share", "open_replicas", "routed"],
        "meter": ["EngineMeter", "MetricsReader"],
        "metrics": ["EngineMetrics", "combined", "counter_total", "metric_totals", "parse_metrics", "read_metrics"],
        "server": ["ENV_ARGS", "VLLMServer", "VLLMServerConfig", "env_args", "free_port", "serving_dtype"],
        "speculative": ["SPECULATIVE_METHODS", "SpeculativeConfig", "check_schedule", "load_aware", "parse_schedule",
                        "schedule_flag"],
        "watch": ["EngineLog", "EngineRestartsExhausted", "EngineWatch", "ManagedEngine", "WatchConfig", "WatchHooks",
                  "Watched", "died_since", "managed", "rerun_on_death", "retry_on_death", "watching"],
    },
)
