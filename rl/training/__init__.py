"""A training run: the loop (:mod:`.trainer`), built from its config (:mod:`.build`), its resumable
checkpoints (:mod:`.checkpoint`), held-out evaluation (:mod:`.heldout`), the metric sinks
(:mod:`.metrics_log`), the engines' share of a step's metrics (:mod:`.engine_step`), and the learning
curves of finished runs (:mod:`.report`, ``sao-report``)."""
