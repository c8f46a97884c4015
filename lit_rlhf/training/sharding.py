"""FSDP2 (`fully_shard`) under Lightning's `ModelParallelStrategy` (`configs/strategy/fsdp2.yaml`,
docs/guides/gpus.md): `shard_module`, called from `configure_model`, shards every model of the
module over all processes, each decoder layer one unit and the root the rest (inside a `peft`
wrapper, the transformers model). Frozen models are gathered unit by unit in their forward and
resharded after it (`memory.frozen_placement: whole` keeps them replicated instead); under
`bf16-mixed` the units compute in bf16 and reduce gradients in fp32. Code that reads weights
outside a forward handles the `DTensor` shards where it does (chunked log-probs, vLLM weight
sync, LoRA merge, `export_sharded`, `keep_frozen_out_of_checkpoints`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_rlhf.lightning_compat import set_model_parallel_sizes


def uses_fsdp2(trainer: Any) -> bool:
    """True when `trainer` runs Lightning's `ModelParallelStrategy` (FSDP2 here)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return trainer is not None and isinstance(getattr(trainer, "strategy", None), ModelParallelStrategy)


def resolve_data_parallel_size(trainer: Any) -> None:
    """`data_parallel_size: auto` is every process (FSDP2 only), not Lightning 2.6's number of nodes
    (a 1-process mesh on a multi-GPU node): set before the strategy builds its mesh."""
    if not uses_fsdp2(trainer):
        return
    strategy = trainer.strategy
    world = strategy.num_nodes * max(1, strategy.num_processes)
    set_model_parallel_sizes(strategy, world_size=world)


def is_sharded(model: nn.Module) -> bool:
    """True when `model` (or a module inside it) was sharded by `fully_shard`."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules whose class a transformers model inside `model` names in `_no_split_modules`."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_root(model: nn.Module) -> nn.Module:
    """The module that holds a model's own weights once its layers are sharded: inside a `peft`
    wrapper the transformers model (its `generate` and the adapter's forward enter it)."""
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
    """FSDP2 on every child of `module` holding parameters when its trainer runs
    `ModelParallelStrategy` (a model already sharded is left as it is)."""
    trainer = module.attached_trainer
    if not uses_fsdp2(trainer):
        return
    problems = unsupported(module, trainer)
    if problems:
        raise ValueError("FSDP2 (ModelParallelStrategy): " + "; ".join(problems))
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mesh = trainer.strategy.device_mesh["data_parallel"]
    bf16 = str(getattr(trainer, "precision", "32-true")) == "bf16-mixed"  # bf16 compute, fp32 gradient reduction
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    for _, child in module.named_children():
        if any(True for _ in child.parameters()):
            shard_model(child, mesh, policy)
    keep_frozen_out_of_checkpoints(module)


def keep_frozen_out_of_checkpoints(module: nn.Module) -> None:
    """Frozen weights are rebuilt from their names, never checkpointed; FSDP2's checkpoint reader
    asks the files for every key of `state_dict()`, so they leave it (a post-hook) and the module
    loads without them (`strict_loading` off; the reader still requires every trained key)."""
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
    """What this module asks of FSDP2 that it cannot do, one line each."""
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
    """`export_hf` of a sharded module: every rank gathers the full weights, rank 0 rebuilds the
    module unsharded from its recorded settings (`rebuild_module`), loads them and exports."""
    from lit_rlhf.training.settings import rebuild_module

    state = full_state_dict(module)  # the trained weights: the frozen ones are rebuilt from their names
    trainer = module.attached_trainer
    if trainer.is_global_zero:
        plain = rebuild_module(type(module), {k: v for k, v in module.hparams.items() if k != "_instantiator"})
        missing, unexpected = plain.load_state_dict(state, strict=False)
        trained = {name for name, p in plain.named_parameters() if p.requires_grad}
        if unexpected or trained & set(missing):
            raise RuntimeError(f"export of the sharded {type(module).__name__}: unexpected weights {unexpected[:5]}, "
                               f"trained weights missing {sorted(trained & set(missing))[:5]}")
        plain.export_hf(directory)
    trainer.strategy.barrier("export")
