"""A LoRA model's network for one adapter as plain weights, computed out of place: what a sampler
(the vLLM engine) holds. `merged_weights` hands out the base with the policy adapter merged, one
layer at a time, leaving the trained model as it is; `adapter_modules` names the modules an
adapter changes, and `base_is_frozen` says whether only those need sending after the first load.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch
from torch import Tensor, nn

from lit_rlhf.models.adapters import adapter_names


def _gathered(params: list[Tensor]):
    """Gather DeepSpeed ZeRO-3 shards among `params` for the block inside (a no-op without)."""
    sharded = [p for p in params if hasattr(p, "ds_id")]
    if not sharded:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(sharded)


@contextmanager
def _unsharded(model: nn.Module):
    """Every FSDP2 unit of `model` unsharded for the block inside (its modules then hold plain,
    whole tensors in the units' compute dtype: one full copy per rank), resharded after; a no-op
    for a model FSDP2 did not shard. A collective: every rank enters it."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    try:
        yield bool(units)
    finally:
        for unit in units:
            unit.reshard()


def _inner_model(model: nn.Module) -> nn.Module:
    from peft import PeftModel

    return model.get_base_model() if isinstance(model, PeftModel) else model


def adapter_modules(model: nn.Module, adapter: str) -> set[str]:
    """Hugging Face names of the modules whose weights `adapter` changes: its LoRA layers and the
    modules it trains in full (`modules_to_save`)."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper

    names = set()
    for name, module in _inner_model(model).named_modules():
        if isinstance(module, ModulesToSaveWrapper) and adapter in module.modules_to_save:
            names.add(name)
        elif isinstance(module, BaseTunerLayer) and _has_lora(module, adapter):
            names.add(name)
    return names


def base_is_frozen(model: nn.Module) -> bool:
    """True when nothing but LoRA weights and `modules_to_save` copies can train: the base's
    weights stay what they were (a sampler holding them needs only the adapters' layers again)."""
    return not any(p.requires_grad for n, p in model.named_parameters()
                   if "lora_" not in n and ".modules_to_save." not in n)


def _has_lora(layer: nn.Module, adapter: str) -> bool:
    return adapter in getattr(layer, "lora_A", {}) or adapter in getattr(layer, "lora_embedding_A", {})


def merged_weights(model: nn.Module, adapter: str, modules: set[str] | None = None) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of the base model with `adapter` merged, in Hugging Face names (the tensors
    `merged_copy(model, adapter)` would have), computed out of place one layer at a time: a LoRA
    layer gives `W + delta` (peft's `get_delta_weight`) and its bias plus the LoRA bias, a
    `modules_to_save` module its trained copy, every other tensor the base's own. `model` is not
    modified; ZeRO-3 layers are gathered (and copied), FSDP2 units unsharded meanwhile.
    `modules`: only the tensors of these modules (Hugging Face names) and their submodules."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper, ModulesToSaveWrapper

    if adapter not in adapter_names(model):
        raise ValueError(f"no adapter {adapter!r} on the model (adapters: {adapter_names(model)})")
    seen: set[int] = set()  # tied weights (one Parameter under two names) are handed out once

    def own(module: nn.Module, prefix: str) -> Iterator[tuple[str, Tensor]]:
        tensors = [(n, p) for n, p in module.named_parameters(recurse=False)]
        tensors += [(n, b) for n, b in module.named_buffers(recurse=False)
                    if n not in module._non_persistent_buffers_set]
        with _gathered([t for _, t in tensors]):
            for name, tensor in tensors:
                if id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                out = tensor.detach()
                yield f"{prefix}{name}", out.clone() if hasattr(tensor, "ds_id") else out

    def merged_layer(layer: nn.Module, prefix: str) -> Iterator[tuple[str, Tensor]]:
        base = layer.get_base_layer()
        if not _has_lora(layer, adapter):
            yield from own(base, prefix)
            return
        if adapter in getattr(layer, "lora_variant", {}):
            raise NotImplementedError(
                f"{prefix.rstrip('.')}: adapter {adapter!r} is a LoRA variant "
                f"({type(layer.lora_variant[adapter]).__name__}, e.g. DoRA); only plain LoRA merges out of place here")
        with _gathered(list(layer.parameters())), torch.no_grad():
            for name, param in base.named_parameters(recurse=False):
                tensor = param.detach()
                if name == "weight":
                    tensor = tensor.clone()
                    tensor += layer.get_delta_weight(adapter).to(tensor.dtype)
                elif name == "bias" and getattr(layer, "lora_bias", {}).get(adapter):
                    tensor = tensor + (layer.lora_B[adapter].bias * layer.scaling[adapter]).to(tensor.dtype)
                elif hasattr(param, "ds_id"):
                    tensor = tensor.clone()
                seen.add(id(param))
                yield f"{prefix}{name}", tensor

    def walk(module: nn.Module, prefix: str, take: bool) -> Iterator[tuple[str, Tensor]]:
        take = take or prefix.rstrip(".") in modules  # type: ignore[operator]
        if isinstance(module, ModulesToSaveWrapper):
            chosen = module.modules_to_save[adapter] if adapter in module.modules_to_save else module.original_module
            yield from walk(chosen, prefix, take)
            return
        if isinstance(module, AuxiliaryTrainingWrapper):
            raise NotImplementedError(f"{prefix.rstrip('.')}: {type(module).__name__} (e.g. trainable tokens) "
                                      "does not merge out of place here")
        if isinstance(module, BaseTunerLayer):
            if take:
                yield from merged_layer(module, prefix)
            return
        if take:
            yield from own(module, prefix)
        for name, child in module.named_children():
            yield from walk(child, f"{prefix}{name}.", take)

    with _unsharded(model) as sharded:
        for name, tensor in walk(_inner_model(model), "", modules is None):
            yield name, tensor.clone() if sharded else tensor
