"""LoRA through ``peft``: the adapted policy, the adapted critic, and the merged weights the engine serves.

* :func:`wrap_policy`: ``peft.get_peft_model`` on the policy; only the adapters train.
* :func:`wrap_value`: adapters on the value model's MLP modules only (the modules of
  ``target_modules`` outside attention, by :mod:`sao.rl.learner.value_model`'s rule), its norms and head
  trainable, everything else frozen: the frozen-attention critic (METHOD.md 1.5) in LoRA form.
* :func:`merged_state_dict`: what a plain Hugging Face model with the adapters merged in would hold,
  under its plain names (``...q_proj.weight``, not ``...q_proj.base_layer.weight``), computed as
  ``W + get_delta_weight()`` without touching the trained model. This is what the engine loads
  (:func:`sao.rl.weights.sync.save_checkpoint`): vLLM serves one dense model, and a reload in place costs
  the same as for full fine-tuning. Untouched tensors are the model's own, so tied embeddings stay
  one tensor and the sync's tied-embeddings rule still applies.

peft is imported only when a model is wrapped; a run without LoRA never loads it, and a model
cannot hold LoRA layers unless peft has been imported (:func:`lora_layers` relies on that).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor, nn

from sao.rl.config import LoraConfig
from sao.rl.learner.value_model import ValueModel, attention_module_names

# The tensors only an adapter has (peft's names); never sent to the engine.
_ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")
# Tied to each other in most small models: an adapter on one would leave the other unmerged.
_TIED_MODULES = ("embed_tokens", "lm_head")


def unwrap(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a ``peft.PeftModel`` (its LoRA layers in place); others as they are."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def lora_layers(model: nn.Module) -> dict[str, Any]:
    """``{module name: peft LoraLayer}`` in ``unwrap(model)``; empty for a plain model."""
    if "peft" not in sys.modules:  # nothing imported peft, so nothing built a LoRA layer
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in unwrap(model).named_modules() if isinstance(m, LoraLayer)}


def has_lora(model: nn.Module) -> bool:
    return bool(lora_layers(model))


def _peft_config(cfg: LoraConfig, target_modules: list[str], task_type: str | None) -> Any:
    import peft

    return peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=list(target_modules), bias="none", task_type=task_type)


def wrap_policy(policy: nn.Module, cfg: LoraConfig) -> nn.Module:
    """``peft.get_peft_model(policy)`` with ``cfg``'s adapters; every other weight frozen.

    The returned ``PeftModel`` runs the adapted policy, and keeps ``policy``'s train/eval mode.
    Raises ValueError when ``cfg.target_modules`` names a tied module or matches no module.
    """
    import peft

    if cfg.rank < 1:
        raise ValueError(f"LoRA needs rank >= 1, got {cfg.rank}")
    tied = sorted(set(cfg.target_modules) & set(_TIED_MODULES))
    if tied:
        raise ValueError(f"model.lora.target_modules: {tied} not supported (tied to each other in most small "
                         "models, so the engine's merged copy would differ from the learner's)")
    training = policy.training
    try:
        wrapped = peft.get_peft_model(policy, _peft_config(cfg, cfg.target_modules, "CAUSAL_LM"))
    except ValueError as exc:
        raise ValueError(f"model.lora.target_modules {list(cfg.target_modules)}: {exc}") from exc
    wrapped.train(training)
    return wrapped


def wrap_value(value: ValueModel, cfg: LoraConfig) -> list[str]:
    """Adapters on the value backbone's MLP modules (those of ``cfg.target_modules`` outside attention);
    trainable afterwards: the adapters, the norms and the head. Returns the adapted modules' names.
    Raises ValueError when no target module lies outside attention."""
    import peft

    attention = attention_module_names(value.backbone)
    targets = [name for name, m in value.backbone.named_modules()
               if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in cfg.target_modules
               and not any(name == p or name.startswith(p + ".") for p in attention)]
    if not targets:
        raise ValueError(f"model.lora.critic: none of {list(cfg.target_modules)} is an MLP module of "
                         f"{type(value.backbone).__name__} (attention stays frozen); add gate_proj, up_proj, down_proj")
    training = value.training
    peft.inject_adapter_in_model(_peft_config(cfg, targets, None), value.backbone)
    norms = {name for name, m in value.backbone.named_modules() if "Norm" in type(m).__name__}
    for name, param in value.backbone.named_parameters():
        owner = name.rsplit(".", 1)[0]
        param.requires_grad_(any(part in name.split(".") for part in _ADAPTER_PARTS) or owner in norms)
    for param in value.head.parameters():
        param.requires_grad_(True)
    value.train(training)
    return targets


@torch.no_grad()
def _delta(layer: Any) -> Tensor | None:
    """The sum of the active, unmerged adapters' deltas of one LoRA layer (None: none): a new float32 tensor."""
    if getattr(layer, "disable_adapters", False):
        return None
    merged = set(getattr(layer, "merged_adapters", ()))
    total = None
    for name in layer.active_adapters:
        if name in merged or (name not in layer.lora_A and name not in getattr(layer, "lora_embedding_A", {})):
            continue
        if getattr(layer, "use_dora", {}).get(name, False):
            raise NotImplementedError("DoRA adapters have no additive delta; merged weights need peft's merge")
        d = layer.get_delta_weight(name).float()  # (B @ A) * scaling, computed afresh
        total = d if total is None else total + d
    return total


def _plain_name(name: str) -> str | None:
    """peft's state-dict name as the plain model's (``a.base_layer.weight`` -> ``a.weight``); None for adapter tensors."""
    parts = name.split(".")
    if any(p in _ADAPTER_PARTS for p in parts):
        return None
    return ".".join(p for p in parts if p != "base_layer")


@torch.no_grad()
def merged_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """The plain model's state dict with the adapters merged (``W + delta``), ``model`` untouched.

    Names are the plain Hugging Face ones vLLM expects. Tensors of modules without adapters are the
    model's own (shared storage, so tied embeddings stay tied); merged ones are new, summed in
    float32 and returned in ``dtype`` (None: the base weight's), so the sync casts them only once.
    """
    base = unwrap(model)
    layers = lora_layers(base)
    out: dict[str, Tensor] = {}
    for name, tensor in base.state_dict().items():
        plain = _plain_name(name)
        if plain is None:
            continue
        owner, _, leaf = name.rpartition(".")
        layer_name = owner.removesuffix(".base_layer") if owner.endswith(".base_layer") else None
        if layer_name in layers and leaf == "weight":
            delta = _delta(layers[layer_name])
            if delta is not None:
                tensor = delta.add_(tensor).to(dtype or tensor.dtype)  # delta is a fresh float32 tensor
        out[plain] = tensor
    return out


@torch.no_grad()
def engine_view(model: nn.Module, dtype: torch.dtype) -> list[tuple[nn.Parameter, Tensor]]:
    """``(parameter, data)`` swaps that make ``model`` compute what the engine serves: every LoRA
    layer's base weight replaced by the merged weight rounded to ``dtype`` and its adapter zeroed
    (``lora_B = 0``), every other floating parameter rounded to ``dtype``. The caller swaps each
    ``param.data`` and puts the originals back (``sao.rl.weights.sync.WeightSync.learner_logprobs``)."""
    base = unwrap(model)
    layers = lora_layers(base)
    replaced: dict[int, Tensor] = {}
    for layer in layers.values():
        weight = layer.get_base_layer().weight
        delta = _delta(layer)
        merged = weight if delta is None else delta.add_(weight).to(weight.dtype)
        replaced[id(weight)] = merged.to(dtype).to(weight.dtype)
        for b in layer.lora_B.values():
            replaced[id(b.weight)] = torch.zeros_like(b.weight)
        for b in getattr(layer, "lora_embedding_B", {}).values():
            replaced[id(b)] = torch.zeros_like(b)
    swaps = []
    for p in base.parameters():
        if id(p) in replaced:
            swaps.append((p, replaced[id(p)]))
        elif p.is_floating_point() and p.dtype != dtype:
            swaps.append((p, p.data.to(dtype).to(p.dtype)))
    return swaps


@torch.no_grad()
def merge_in_place(module: nn.Module) -> nn.Module:
    """Replace every LoRA layer inside ``module`` by its base layer with the adapters' delta added:
    a plain module that computes the same function. Mutates ``module``: call it on a copy
    (:meth:`sao.rl.learner.value_model.ValueModel.from_policy` does). Returns ``module``."""
    for name, layer in sorted(lora_layers(module).items(), key=lambda kv: -kv[0].count(".")):
        base = layer.get_base_layer()
        delta = _delta(layer)
        if delta is not None:
            base.weight.add_(delta.to(base.weight.dtype))
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, child, base)
    return module


def trainable_summary(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
