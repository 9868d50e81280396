"""How the learner's models are laid out over its data-parallel ranks: ``learner.sharding``.

``replicate`` (the default, :class:`Replicated`): every rank holds the whole model, its gradients and
its optimizer state; :meth:`sao.rl.learner.parallel.data_parallel.DataParallel.sum_grads` all-reduces the gradients.
:meth:`Replicated.wrap` leaves the model as it is, so this path is the data-parallel learner of
:mod:`sao.rl.learner.parallel.data_parallel`, unchanged.

``fsdp2`` (:class:`FullyShardedFSDP2`): PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``),
for a model whose weights, gradients and AdamW state do not fit one device. Each decoder layer
becomes an FSDP unit, then the trunk (embeddings, final norm), the head, then the root; every
parameter becomes a DTensor sharded on dim 0 over the default process group, so a rank keeps 1/N of
each weight, its gradient and its optimizer state. A unit's parameters are all-gathered just before
its forward (again for its backward) and freed after. The gradients are reduce-scattered by FSDP in
the backward and *summed*, not averaged: the learner's losses are already divided by the whole
batch's normalizer (sao.rl.learner.parallel.data_parallel), so the sum is the single-process gradient. Hence
:attr:`ModelSharding.reduces_grads`: such models need ``DataParallel(reduce_grads=False)``, or each
gradient would be summed a second time. ``clip_grad_norm_`` and the optimizers work on the shards as
they are (the norm is the whole model's).

Status: a seam, not a training mode yet. What works (tests/test_sharding.py, 2 gloo ranks on the CPU;
benchmarks/gpu/fsdp2_check.py for CUDA, not run yet): :meth:`FullyShardedFSDP2.wrap`, forward and
backward on each rank's rows, clipping and an SGD step on the shards give the single-process update
on the whole batch within 1e-6; so does :meth:`sao.rl.learner.learner.Learner.policy_step` with
``DataParallel(reduce_grads=False)`` when every rank makes the same calls. ``sao-train`` refuses
``learner.sharding=fsdp2`` (:func:`require_trainer_support`, called before any rank starts) with
NotImplementedError naming :data:`FSDP2_NOT_YET`, the parts of the trainer that do not handle
sharded models yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

# What the trainer still lacks for FSDP2, each with what it needs (require_trainer_support's message).
FSDP2_NOT_YET = (
    "equal collectives: each FSDP unit's forward is a collective every rank must make, but the learner "
    "gives each rank its own rows, so ranks make different numbers of micro-batches (sao.rl.learner.batch."
    "micro_batches) and of LM-head chunks (Learner.token_logprobs), and a rank with no rows makes none; "
    "needs every rank padded to the same counts, with empty micro-batches adding zero gradient",
    "checkpoints (sao.rl.training.checkpoint.Checkpoints.save/load): they pickle model.state_dict() and the "
    "optimizers' state_dict(), which are this rank's DTensor shards; needs a full state gathered on "
    "every rank and written by rank 0 (torch.distributed.checkpoint.state_dict, full_state_dict=True), "
    "loaded with broadcast_from_rank0",
    "weight sync and the engine export (sao.rl.weights.sync.save_checkpoint, export_engine_model, weight_change): "
    "they read model.state_dict(); needs ModelSharding.full_state_dict on every rank, written by rank 0",
    "rank 0's state to the followers (sao.rl.learner.parallel.ranks.broadcast_learner): it broadcasts whole tensors; "
    "needs each rank to take its shard of rank 0's full state instead",
)


@dataclass(frozen=True)
class ShardedModel:
    """What :meth:`ModelSharding.wrap` did to one model, on this rank.

    ``units``: the qualified names of the modules that became FSDP units, innermost first (``""``
    is the root); empty when nothing was wrapped. ``params``: the model's parameter elements;
    ``local_params``: those this rank stores (``params`` when replicated, about ``params / world_size``
    when sharded: each parameter's dim 0 is split, the last shard padded)."""

    strategy: str
    world_size: int
    units: tuple[str, ...]
    params: int
    local_params: int


class ModelSharding(Protocol):
    """How a learner's models are wrapped for data parallelism (one per ``learner.sharding`` value)."""

    name: str
    reduces_grads: bool  # True: the wrapper sums gradients over the ranks; DataParallel must not
    not_yet: tuple[str, ...]  # what sao-train lacks to train with it (empty: supported end to end)

    def wrap(self, model: nn.Module) -> ShardedModel:
        """Lay ``model`` out over the ranks, in place; before its optimizer is built (FSDP2 replaces
        the parameters). Every rank calls it with the same model."""
        ...

    def full_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        """The whole model's state, plain tensors (a collective under FSDP2: every rank calls it)."""
        ...


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _numel(model: nn.Module, local: bool) -> int:
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if local and isinstance(p, DTensor) else p).numel() for p in model.parameters())


class Replicated:
    """Today's data parallelism: every rank holds the whole model; gradients are all-reduced by
    :meth:`sao.rl.learner.parallel.data_parallel.DataParallel.sum_grads`."""

    name = "replicate"
    reduces_grads = False
    not_yet: tuple[str, ...] = ()

    def wrap(self, model: nn.Module) -> ShardedModel:
        n = _numel(model, local=False)
        return ShardedModel(self.name, _world_size(), (), n, n)

    def full_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        return model.state_dict()


def _trunk_and_heads(model: nn.Module) -> tuple[nn.Module, list[tuple[str, nn.Module]]]:
    """The model's trunk and the (qualified name, module) of the modules the learner calls outside
    the root's forward: a causal LM's output embeddings (``token_logprobs`` runs the trunk, then the
    head, never ``model.forward``), a value model's scalar head."""
    from sao.rl.learner.value_model import ValueModel, backbone_of

    if isinstance(model, ValueModel):
        return model.backbone, [("head", model.head)]
    trunk = backbone_of(model)
    head = model.get_output_embeddings()
    names = {id(m): name for name, m in model.named_modules()}
    return trunk, ([(names[id(head)], head)] if head is not None else [])


class FullyShardedFSDP2:
    """FSDP2 over the default process group: ``fully_shard`` per decoder layer, then the trunk, the
    head(s) and the root (module doc). Gradients are summed over the ranks (divide factor 1, plain
    SUM collectives, which gloo has too)."""

    name = "fsdp2"
    reduces_grads = True
    not_yet = FSDP2_NOT_YET

    def __init__(self, mesh: object | None = None) -> None:
        # a torch DeviceMesh; None: every rank of the default group, on the model's device type (not
        # FSDP2's default, which is CUDA whenever a GPU exists, and would move a CPU model there)
        self.mesh = mesh

    def wrap(self, model: nn.Module) -> ShardedModel:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        from sao.rl.learner.lora import has_lora

        if has_lora(model):
            raise NotImplementedError("learner.sharding=fsdp2 with LoRA adapters (model.lora.rank > 0) is not "
                                      "supported yet: use learner.sharding=replicate")
        trunk, heads = _trunk_and_heads(model)
        layers = getattr(trunk, "layers", None)
        if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
            raise NotImplementedError(f"learner.sharding=fsdp2 shards a trunk's decoder layers at .layers "
                                      f"(Llama, Qwen, Mistral); {type(trunk).__name__} has none")
        trunk_params = {id(p) for p in trunk.parameters()}
        for head_name, head in heads:
            if any(id(p) in trunk_params for p in head.parameters()):
                raise NotImplementedError(
                    f"learner.sharding=fsdp2 with tied input/output embeddings ({type(model).__name__}.{head_name} "
                    "shares its weight with the trunk) is not supported yet: FSDP2 cannot put one parameter in "
                    "two units; untie them (tie_word_embeddings=false) or use learner.sharding=replicate")
        names = {id(m): name for name, m in model.named_modules()}
        units = [*layers, trunk, *(head for _, head in heads), model]
        mesh = self.mesh if self.mesh is not None else init_device_mesh(next(model.parameters()).device.type,
                                                                         (_world_size(),))
        for unit in units:
            fully_shard(unit, mesh=mesh)
        for unit in units:
            assert isinstance(unit, FSDPModule)
            # sum, not mean: the losses already carry the whole batch's normalizer
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        return ShardedModel(self.name, _world_size(), tuple(names[id(u)] for u in units),
                            _numel(model, local=False), _numel(model, local=True))

    def full_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        from torch.distributed.tensor import DTensor

        return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}


STRATEGIES: dict[str, type[Replicated] | type[FullyShardedFSDP2]] = {
    Replicated.name: Replicated, FullyShardedFSDP2.name: FullyShardedFSDP2}


def make_sharding(name: str) -> ModelSharding:
    """The strategy for ``learner.sharding`` (the config has checked the name)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown learner.sharding {name!r} (known: {', '.join(STRATEGIES)})")
    return STRATEGIES[name]()


def require_trainer_support(sharding: ModelSharding) -> None:
    """Refuse, before any rank starts, a strategy the trainer cannot run end to end yet (module doc)."""
    if not sharding.not_yet:
        return
    raise NotImplementedError(
        f"learner.sharding={sharding.name} is a seam only (sao.rl.learner.sharding): the model can be wrapped "
        "and an update on the shards equals the replicated one, but sao-train does not yet handle sharded "
        "models in: " + "; ".join(f"({i}) {what}" for i, what in enumerate(sharding.not_yet, 1))
        + ". Use learner.sharding=replicate.")
