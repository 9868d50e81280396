"""Which prompts a run sees: the deterministic, resumable task stream (:mod:`.tasks`), the curriculum
of online learning (:mod:`.curriculum`), and the prompts admitted but not yet trained (:mod:`.open_prompts`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "curriculum": ["ScheduleError", "ScheduledTaskStream", "adaptation_lag", "family_metrics", "family_rewards",
                       "forgetting", "history_from_metrics", "make_schedule", "phase_shifts"],
        "open_prompts": ["OpenPrompts", "ref_from_dict", "ref_to_dict"],
        "tasks": ["PromptRef", "TaskStream"],
    },
)
