"""The learner: its building blocks (:mod:`.learner`: token log-probs, the critic step, the policy
step), its input record (:mod:`.batch`), the value model (:mod:`.value_model`), the policy's lr schedule
(:mod:`.lr_schedule`), which episodes it may train on (:mod:`.trainable`), and how it runs: packed
micro-batches (:mod:`.packing`), bf16 where it pays (:mod:`.precision`), LoRA (:mod:`.lora`),
activation recompute (:mod:`.activation_recompute`), sharding (:mod:`.sharding`), the process's memory
(:mod:`.memory`), the one torch thread (:mod:`.torch_thread`), and data-parallel ranks (:mod:`.parallel`)."""
