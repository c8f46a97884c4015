"""The weights a colocated vLLM engine (`lit_rlhf.generation.vllm`) gets from the policy: its
parameters (gathered under ZeRO-3; under FSDP2 by `DTensor.full_tensor()`), or a LoRA policy's
base with the policy adapter merged out of place (`lit_rlhf.models.merging.merged_weights`; the
trained model and the reference stay as they are). While the base is frozen, a sync sends only the
layers the adapter changes, completed to whole vLLM layers where vLLM fuses several checkpoint
tensors (`packed_modules_mapping`: q/k/v -> qkv_proj, gate/up -> gate_up_proj); the in-place
reload keeps the others (SmolLM2-135M, fp32: 405 of 513 MiB per sync with `all-linear`, 63 with
q/v only). vLLM's own LoRA serving (`enable_lora`, a `LoRARequest` per rollout; it works on the CPU
wheel) would send only the adapter, but is not used: each decoding step would pay the LoRA
kernels on top of the base's, the adapter be written to disk at each sync, `max_lora_rank` be
fixed at build time, at most one `modules_to_save` be accepted, and a second code path exist
beside full fine-tuning's. Which is faster on a GPU is not measured.
"""

from __future__ import annotations

import copy
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from torch import Tensor, nn

from lit_rlhf.models import adapters, merging


def gathered_parameters(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name, full tensor) for every parameter and buffer of `model`, in Hugging Face names;
    a DeepSpeed ZeRO-3 parameter is gathered (one at a time) before it is handed out, an FSDP2
    shard (a `DTensor`) too (`full_tensor()`). Both are collectives: every rank iterates."""
    from torch.distributed.tensor import DTensor

    for name, param in model.named_parameters():
        if hasattr(param, "ds_id"):  # ZeRO-3 shard
            import deepspeed

            with deepspeed.zero.GatheredParameters([param]):
                yield name, param.data.detach().clone()
        elif isinstance(param, DTensor):  # FSDP2 shard
            yield name, param.detach().full_tensor()
        else:
            yield name, param.detach()
    for name, buf in model.named_buffers():
        if "rotary" not in name and "inv_freq" not in name:
            yield name, buf.detach()


def policy_adapter(policy: nn.Module, adapter: str | None = None) -> str | None:
    """The LoRA adapter of `policy` the engine samples (None for a model without adapters):
    `adapter` when given, else `policy` when the model has one, else its active adapter."""
    names = adapters.adapter_names(policy)
    if not names:
        if adapter is not None:
            raise ValueError(f"adapter {adapter!r} given, but the policy ({type(policy).__name__}) "
                             "has no LoRA adapters")
        return None
    if adapter is None:
        active = getattr(policy, "active_adapter", None)
        adapter = adapters.POLICY if adapters.POLICY in names else active if isinstance(active, str) else names[0]
    if adapter not in names:
        raise ValueError(f"no adapter {adapter!r} on the policy (adapters: {names})")
    return adapter


def check_tied_embeddings(policy: nn.Module, adapter: str) -> None:
    """Refuse an adapter that changes the input or output embeddings of a model with tied
    embeddings: the trainer then uses two different matrices (LoRA on the lookup, or a trained
    copy of the output layer), which vLLM's tied layer cannot hold."""
    inner = policy.get_base_model()
    if not getattr(inner.config, "tie_word_embeddings", False):
        return
    embeddings = [inner.get_input_embeddings(), inner.get_output_embeddings()]
    names = {n for n, m in inner.named_modules() if any(m is e for e in embeddings if e is not None)}
    changed = sorted(names & merging.adapter_modules(policy, adapter))
    if changed:
        raise ValueError(f"adapter {adapter!r} changes {changed} of a model with tied embeddings: the trainer's "
                         "input and output embeddings then differ, which the vLLM engine's tied layer cannot hold; "
                         "leave the embeddings out of target_modules / modules_to_save, or sample with HFSampler")


def save_merged_checkpoint(policy: nn.Module, adapter: str, directory: str | Path) -> None:
    """Write the base of the LoRA model `policy` with `adapter` merged (`merging.merged_weights`)
    as a plain Hugging Face checkpoint: `config.json` and `model.safetensors`."""
    from safetensors.torch import save_file

    inner = policy.get_base_model()
    config = copy.deepcopy(inner.config)
    config.architectures = [type(inner).__name__]
    config.save_pretrained(directory)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in merging.merged_weights(policy, adapter)}
    save_file(tensors, str(Path(directory) / "model.safetensors"), metadata={"format": "pt"})


def with_packed_siblings(modules: set[str], packed: dict[str, list[str]]) -> set[str]:
    """`modules` plus every module vLLM fuses with one of them into one layer (`packed`: vLLM's
    `packed_modules_mapping`, e.g. `{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}`): the names a
    reload must cover so that each fused layer gets all its parts."""
    out = set(modules)
    for name in modules:
        prefix, _, leaf = name.rpartition(".")
        for parts in packed.values():
            if leaf in parts:
                out.update(f"{prefix}.{part}" if prefix else part for part in parts)
    return out


@contextmanager
def quiet_partial_reload() -> Iterator[None]:
    """vLLM warns once per layer a reload gives no tensor to: expected when only the layers an
    adapter changes are sent; silence those loggers for the reload."""
    names = ("vllm.model_executor.model_loader.reload.layerwise", "vllm.model_executor.model_loader.reload.inplace")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def packed_modules_mapping(model: nn.Module) -> dict[str, list[str]]:
    """vLLM's fused layers of `model` (an engine's model, run through `LLM.apply_model`) and the
    checkpoint modules each is made of, e.g. `{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}`."""
    return {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}


def reprocess_embeddings(model: nn.Module) -> None:
    """Redo the post-loading step of every embedding-type layer of `model` (an engine's model): a
    tied output layer gets no weights of its own in a reload, which then skips it (on CPU: the
    GEMM-ready copy of the weight)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(module)
