"""SAO's value model: the policy's backbone (a deep copy) plus a fresh scalar head (METHOD.md 1.2, 1.5).

Frozen attention (METHOD.md 1.5) rule: a parameter is "attention" when it lives under a submodule that
mixes tokens, i.e. a module whose class name contains ``Attention`` (``LlamaAttention``,
``Qwen2Attention``, ``MixtralAttention``, ...) or whose own attribute name is one of ``self_attn``,
``attn``, ``attention``, ``cross_attn``. For Llama that is exactly ``layers.*.self_attn.{q,k,v,o}_proj.*``.
Everything else stays trainable: MLP/FFN, norms, the head, and the token embeddings. Embeddings are a
per-token lookup (they mix nothing across positions) and the paper lists only attention as frozen, so
they train with the rest. :meth:`ValueModel.freeze_attention` raises if the rule matches nothing, so a
new architecture cannot silently train its attention.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from sao.rl.learner.packing import trunk_hidden

_ATTENTION_NAMES = ("self_attn", "attn", "attention", "cross_attn")


def backbone_of(causal_lm: nn.Module) -> nn.Module:
    """The transformer trunk of a Hugging Face causal LM (``model.model`` for Llama), without the LM head.

    A ``peft.PeftModel`` is unwrapped first (``get_base_model()``): its trunk is the base model's,
    with the LoRA layers in place, so it computes the adapted policy."""
    get_base = getattr(causal_lm, "get_base_model", None)
    if callable(get_base):
        causal_lm = get_base()
    prefix = getattr(causal_lm, "base_model_prefix", "model")
    trunk = getattr(causal_lm, prefix, None)
    if not isinstance(trunk, nn.Module) or trunk is causal_lm:
        raise TypeError(f"{type(causal_lm).__name__} has no backbone at .{prefix}; pass a *ForCausalLM model")
    return trunk


def attention_module_names(module: nn.Module) -> list[str]:
    """Names (as in ``module.named_modules()``) of the token-mixing submodules, by the module-doc rule."""
    return [name for name, sub in module.named_modules()
            if name and ("Attention" in type(sub).__name__ or name.rsplit(".", 1)[-1] in _ATTENTION_NAMES)]


def attention_param_names(module: nn.Module) -> list[str]:
    """Names (as in ``module.named_parameters()``) of the token-mixing parameters, by the module-doc rule."""
    prefixes = attention_module_names(module)
    return [name for name, _ in module.named_parameters()
            if any(name.startswith(p + ".") for p in prefixes)]


class ValueModel(nn.Module):
    """``V(prefix)``: a scalar head on the backbone's last hidden state at every position.

    backbone: a Hugging Face base model (``LlamaModel``...) returning ``last_hidden_state`` [B, T, H].
    The head is ``nn.Linear(H, 1)`` in float32 with a small init (std 1e-3, bias 0), so initial values
    are near 0 and the backbone's pretrained features are not disturbed by large early gradients.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        nn.init.normal_(self.head.weight, std=1e-3)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: nn.Module) -> ValueModel:
        """A value model whose backbone is a deep copy of ``policy``'s (no shared tensors); head fresh.
        It lands on the policy's device and dtype; the head stays float32. A LoRA policy's trunk is
        copied with its adapters merged in (a plain trunk, every parameter trainable); give the critic
        adapters of its own with :func:`sao.rl.learner.lora.wrap_value`."""
        from sao.rl.learner.lora import has_lora, merge_in_place  # here: sao.rl.learner.lora imports this module

        trunk = copy.deepcopy(backbone_of(policy))
        if has_lora(trunk):
            merge_in_place(trunk)
            trunk.requires_grad_(True)
        value = cls(trunk, policy.config.hidden_size)
        value.head.to(next(trunk.parameters()).device)
        return value

    def forward(self, input_ids: Tensor, attention_mask: Tensor, packed: bool = False) -> Tensor:
        """values [B, T] float32: ``values[:, t] = V(tokens[:t + 1])``, the head on position t's hidden
        state (the state AFTER token t). For values aligned with action tokens use :meth:`token_values`.
        ``packed``: the backbone runs on the rows laid end to end (:mod:`sao.rl.learner.packing`)."""
        return self.head_values(trunk_hidden(self.backbone, input_ids, attention_mask, packed))

    def head_values(self, hidden: Tensor) -> Tensor:
        """The head on hidden states [..., H]: values [...] float32; a closed-form head's are clipped to
        the range of the targets it was fitted on (:meth:`~sao.rl.learner.ridge_head.RidgeHead.bound`)."""
        values = self.head(hidden.float()).squeeze(-1)
        fit = getattr(self, "head_fit", None)
        return values if fit is None else fit.bound(values)

    def token_values(self, input_ids: Tensor, attention_mask: Tensor, packed: bool = False) -> tuple[Tensor, Tensor]:
        """Token-aligned values and the final-state value, for GAE.

        Returns (values [B, T], last [B]): ``values[:, t] = V(tokens[:t])``, the state in which token t
        was chosen, read from position t - 1 (``values[:, 0] = 0``; token 0 is never an action);
        ``last[b] = V(all of row b's tokens)``, the state after its final real token (the bootstrap of
        a truncated episode).
        """
        v = self(input_ids, attention_mask, packed)
        shifted = torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], dim=1)
        last_index = (attention_mask.sum(-1) - 1).clamp(min=0)
        return shifted, v.gather(1, last_index[:, None]).squeeze(1)

    def token_features(self, input_ids: Tensor, attention_mask: Tensor, packed: bool = False) -> tuple[Tensor, Tensor]:
        """The trunk's hidden states aligned as :meth:`token_values` aligns values: (features [B, T, H],
        ``features[:, t]`` the state in which token t was chosen, zeros at t = 0; last [B, H], the state after
        each row's final real token). The head on them gives :meth:`token_values` (but at t = 0)."""
        hidden = trunk_hidden(self.backbone, input_ids, attention_mask, packed)
        shifted = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
        last_index = (attention_mask.sum(-1) - 1).clamp(min=0)
        return shifted, hidden[torch.arange(hidden.shape[0], device=hidden.device), last_index]

    def fit_head_in_closed_form(self, ridge: float, decay: float = 1.0) -> None:
        """Freeze every parameter and keep the statistics of a ridge-fitted head
        (:mod:`sao.rl.learner.ridge_head`) as the ``head_fit`` buffers, saved with the weights."""
        from sao.rl.learner.ridge_head import RidgeHead  # here: ridge_head imports the learner lazily

        self.requires_grad_(False)
        self.head_fit = RidgeHead(self.head.in_features, ridge, decay).to(self.head.weight.device)

    def freeze_attention(self) -> list[str]:
        """Stop gradients to the backbone's attention parameters (module-doc rule). Returns their names
        (relative to the backbone). Raises ValueError when no attention parameter is found."""
        names = set(attention_param_names(self.backbone))
        if not names:
            raise ValueError(f"no attention parameters found in {type(self.backbone).__name__}; "
                             f"extend the rule in sao.rl.learner.value_model (module names {_ATTENTION_NAMES})")
        for name, param in self.backbone.named_parameters():
            if name in names:
                param.requires_grad_(False)
        return sorted(names)

    def unfreeze(self) -> None:
        """Make every parameter trainable again (e.g. for value pretraining before RL)."""
        for param in self.parameters():
            param.requires_grad_(True)
