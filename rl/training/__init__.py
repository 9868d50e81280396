"""A training run: the loop (:mod:`.trainer`), built from its config (:mod:`.build`), its folder (:mod:`.run_folder`:
the files, starting or resuming, the records written as it goes), its resumable checkpoints (:mod:`.checkpoint`), held-out evaluation (:mod:`.heldout`), the metric sinks
(:mod:`.metrics_log`) and experiment trackers (:mod:`.trackers`: TensorBoard, W&B, MLflow), the engines' share of a step's metrics (:mod:`.engine_step`), and the learning
curves of finished runs (:mod:`.report`, ``sao-report``)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "build": ["make_learner", "run_training"],
        "checkpoint": ["CheckpointError", "Checkpointer", "TrainState"],
        "engine_step": ["StepEngineMetrics"],
        "heldout": ["HeldOutEval"],
        "metrics_log": ["ConsoleSink", "JsonlSink", "MetricsSink", "MultiSink"],
        "run_folder": ["RunFiles", "RunRecords", "refuse_to_overwrite", "start_or_resume"],
        "trainer": ["TrainError", "Trainer"],
    },
)
