"""Activation checkpointing for long sequences: recompute each decoder layer in the backward pass
instead of keeping its activations.

A coding trajectory is 2,000 tokens where an arithmetic one is 150; without checkpointing the
policy's and the critic's activations for one such sequence took the trainer to 9.2 GB (and an OOM
kill beside a benchmark) on SmolLM2-135M. Checkpointing keeps one hidden state per layer and costs
about one more forward pass.

Hugging Face runs a layer checkpointed only when the layer is in training mode, but the learner
keeps its models in eval mode (no dropout: its log-probs must match the engine's). So only the
decoder layers' own ``training`` flag is set, not their children's: the checkpointing switch turns
on, every dropout stays off.
"""

from __future__ import annotations

from torch import nn


def enable_activation_checkpointing(model: nn.Module) -> int:
    """Checkpoint every decoder layer of ``model`` (a Hugging Face model, or a module holding one);
    returns how many layers are checkpointed (0: the model has no checkpointable layers)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    hf = next((m for m in model.modules() if hasattr(m, "gradient_checkpointing_enable")), None)
    if hf is None:
        return 0
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer.training = True  # this module only: its dropout children stay in eval mode (module doc)
    return len(layers)
