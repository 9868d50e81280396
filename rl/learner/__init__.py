"""The learner: its building blocks (:mod:`.learner`: token log-probs, the critic step, the policy
step), its input record (:mod:`.batch`), the critic's explained variance (:mod:`.explained_variance`),
the value model (:mod:`.value_model`), the policy's lr schedule (:mod:`.lr_schedule`), which episodes
it may train on (:mod:`.trainable`), and how it runs: packed micro-batches (:mod:`.packing`), bf16
where it pays (:mod:`.precision`), LoRA (:mod:`.lora`), activation recompute
(:mod:`.activation_recompute`), sharding (:mod:`.sharding`), the process's memory (:mod:`.memory`),
the one torch thread (:mod:`.torch_thread`), and data-parallel ranks (:mod:`.parallel`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "activation_recompute": ["enable_activation_checkpointing"],
        "batch": ["Batch", "collate", "micro_batches"],
        "explained_variance": ["explained_variance", "first_action_explained_variance"],
        "learner": ["Learner", "LearnerConfig", "PolicyLoss", "token_logprobs"],
        "lora": ["engine_view", "has_lora", "merged_state_dict", "unwrap"],
        "lr_schedule": ["LR_DECAYS", "LrSchedule"],
        "memory": ["configure_allocator", "release", "rss_gb"],
        "precision": ["resolve_bf16"],
        "torch_thread": ["TorchThread", "pin_caller"],
        "trainable": ["failure"],
        "value_model": ["ValueModel"],
    },
)
