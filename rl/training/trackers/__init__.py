"""Experiment trackers behind one small interface (:class:`Tracker`, :mod:`.tracker`): TensorBoard
(:mod:`.tensorboard`), Weights & Biases (:mod:`.wandb`) and MLflow (:mod:`.mlflow`), selected several at once
with ``logger=[tensorboard,wandb,mlflow]`` and opened at a run's start (:mod:`.registry`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "tracker": ["Tracker", "TrackerSink", "flatten", "scalars"],
        "registry": ["open_trackers"],
        "tensorboard": ["TensorBoardTracker"],
        "wandb": ["WandbTracker"],
        "mlflow": ["MlflowTracker"],
    },
)
