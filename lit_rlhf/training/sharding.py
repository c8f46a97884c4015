"""FSDP2 (`torch.distributed.fsdp.fully_shard`) under Lightning's `ModelParallelStrategy`.

`configs/strategy/fsdp2.yaml` selects the strategy; `TrainingModule.configure_model` calls
`shard_module`, which shards every model of the module over all processes (one data-parallel
dimension, no tensor parallelism):

- each decoder layer (the classes a Hugging Face model lists in `_no_split_modules`) is one
  `fully_shard` unit, then the model's root holds the rest (embeddings, final norm, output layer,
  a scalar head). The root is the transformers model itself, inside a `peft` wrapper (a LoRA
  policy: the frozen base and its trainable adapters in the same units), so `generate` and the
  adapter's forward both enter it;
- the trained models (the policy, PPO's value model, DRO-V's value) and the frozen ones (the
  reference, a reward model, a teacher) alike: a frozen model is gathered unit by unit in its
  forward passes (a layer, or the root's embeddings and output layer, at a time) and resharded
  after each, since it has no backward pass. `memory.frozen_placement: whole`
  keeps the frozen models out of the module tree, so they stay replicated on every process (no
  all-gathers; the memory of one full copy each);
- mixed precision follows the trainer: under `bf16-mixed` the units compute in bf16 and reduce
  gradients in fp32 (`MixedPrecisionPolicy`); otherwise they compute in their weights' dtype.

Code that reads weights outside a model's forward sees `DTensor` shards and handles them where it
does: the chunked log-prob path runs as the root's forward (`lit_rlhf.models.logprobs`), the vLLM
weight sync gathers full tensors (`DTensor.full_tensor()`), the LoRA merge unshards the units
while it reads them (`lit_rlhf.models.merging`), the export at fit end consolidates the state
first (`export_sharded`), and frozen weights stay out of checkpoints
(`keep_frozen_out_of_checkpoints`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_rlhf.lightning_compat import attached_trainer, set_model_parallel_sizes


def uses_fsdp2(trainer: Any) -> bool:
    """True when `trainer` runs Lightning's `ModelParallelStrategy` (FSDP2 here)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return trainer is not None and isinstance(getattr(trainer, "strategy", None), ModelParallelStrategy)


def resolve_data_parallel_size(trainer: Any) -> None:
    """`data_parallel_size: auto` with `tensor_parallel_size: 1` means every process shards the
    weights (FSDP2 only). Lightning 2.6 resolves `auto` to the number of nodes (its 2-D meshes put
    tensor parallelism inside a node), which leaves a 1-process mesh on a multi-GPU node: set the
    data-parallel size to the world size before the strategy builds its mesh."""
    if not uses_fsdp2(trainer):
        return
    strategy = trainer.strategy
    world = strategy.num_nodes * max(1, strategy.num_processes)
    set_model_parallel_sizes(strategy, world_size=world)


def mixed_precision(trainer: Any):
    """The `MixedPrecisionPolicy` matching the trainer's precision: bf16 compute with fp32
    gradient reduction under `bf16-mixed`; None (the weights' dtype) otherwise."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if str(getattr(trainer, "precision", "32-true")) == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def is_sharded(model: nn.Module) -> bool:
    """True when `model` (or a module inside it) was sharded by `fully_shard`."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of every transformers model inside `model`: the modules whose class a
    model names in `_no_split_modules` (what accelerate and transformers' FSDP wrapping use)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_root(model: nn.Module) -> nn.Module:
    """The module that holds a model's own weights once its layers are sharded: the transformers
    model inside a `peft` wrapper (its `generate` and the adapter's forward enter that one), else
    `model`."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) and type(model).__module__.startswith("peft") else model


def shard_model(model: nn.Module, mesh: Any, mp_policy: Any = None) -> None:
    """`fully_shard` each decoder layer of `model`, then its root (`shard_root`); a no-op for a
    model already sharded."""
    from torch.distributed.fsdp import fully_shard

    if is_sharded(model):
        return
    kwargs = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    # a root keeps its weights whole from its forward to its backward; a frozen model has no
    # backward, so its root reshards right after each forward
    frozen = not any(p.requires_grad for p in model.parameters())
    fully_shard(shard_root(model), **kwargs, **({"reshard_after_forward": True} if frozen else {}))


def shard_module(module: nn.Module) -> None:
    """FSDP2 on every model of a lit_rlhf module (each child holding parameters) when its trainer
    runs `ModelParallelStrategy`; nothing otherwise. Called from `configure_model`, so once per
    fit, validate or test (a model already sharded is left as it is)."""
    trainer = attached_trainer(module)
    if not uses_fsdp2(trainer):
        return
    problems = unsupported(module, trainer)
    if problems:
        raise ValueError("FSDP2 (ModelParallelStrategy): " + "; ".join(problems))
    mesh = trainer.strategy.device_mesh["data_parallel"]
    policy = mixed_precision(trainer)
    for _, child in module.named_children():
        if any(True for _ in child.parameters()):
            shard_model(child, mesh, policy)
    keep_frozen_out_of_checkpoints(module)


def keep_frozen_out_of_checkpoints(module: nn.Module) -> None:
    """Frozen weights (the frozen models, a LoRA policy's base) are rebuilt from their names, never
    checkpointed. Under FSDP2 the strategy reads the weights of a sharded checkpoint back into
    `state_dict()`'s tensors, asking the files for every key: so the frozen ones leave
    `state_dict()` itself (a post-hook), and the module loads without them (`strict_loading`
    off; every trained key is still required by the checkpoint reader)."""
    if getattr(module, "_drops_frozen_state", False):
        return

    def drop_frozen(mod: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
        frozen = tuple(f"{prefix}{name}." for name in getattr(mod, "_frozen_names", ()))
        fixed = {f"{prefix}{name}" for name, p in mod.named_parameters(remove_duplicate=False) if not p.requires_grad}
        for key in [k for k in state_dict if k in fixed or k.startswith(frozen)]:
            del state_dict[key]

    module.register_state_dict_post_hook(drop_frozen)
    module.strict_loading = False
    module._drops_frozen_state = True


def unsupported(module: nn.Module, trainer: Any) -> list[str]:
    """What this module asks of FSDP2 that it cannot do, one line each (`optimizer_in_backward` is
    refused by the start-up checks, `lit_rlhf.training.in_backward.startup_problems`)."""
    problems = []
    mesh = trainer.strategy.device_mesh
    if mesh["tensor_parallel"].size() != 1:
        problems.append(f"tensor_parallel_size must be 1 (FSDP2 only), got {mesh['tensor_parallel'].size()}")
    from lit_rlhf.models.scalar_adapters import AdapterScalarModel

    shared = [name for name, m in module.named_children() if isinstance(m, AdapterScalarModel)]
    if shared:
        problems.append(f"{', '.join(shared)}: an adapter on the policy's base runs the base's decoder outside "
                        "the policy's forward; give it its own model (`lora: null`, or a reward model on another base)")
    return problems


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight of `model` as full tensors on the CPU of rank 0 (empty elsewhere): a
    collective, every rank must call it. Plain `state_dict()` for a model that is not sharded."""
    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))



def export_sharded(module: Any, directory: str) -> None:
    """`export_hf` of a sharded module: every rank gathers the full weights (a collective), rank 0
    rebuilds the module unsharded from its recorded settings (`lit_rlhf.training.settings`, as
    `python -m lit_rlhf.export` does from a checkpoint), loads them and writes the Hugging Face
    directory; the other ranks wait for it."""
    from lit_rlhf.training.settings import rebuild_module

    state = full_state_dict(module)  # the trained weights: the frozen ones are rebuilt from their names
    trainer = attached_trainer(module)
    if trainer.is_global_zero:
        plain = rebuild_module(type(module), {k: v for k, v in module.hparams.items() if k != "_instantiator"})
        missing, unexpected = plain.load_state_dict(state, strict=False)
        trained = {name for name, p in plain.named_parameters() if p.requires_grad}
        if unexpected or trained & set(missing):
            raise RuntimeError(f"export of the sharded {type(module).__name__}: unexpected weights {unexpected[:5]}, "
                               f"trained weights missing {sorted(trained & set(missing))[:5]}")
        plain.export_hf(directory)
    trainer.strategy.barrier("export")
