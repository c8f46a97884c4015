"""`VLLMSampler`: the rollout source of a vLLM engine colocated in this process."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rlhf.generation import SamplingConfig
from lit_rlhf.online.correction import RolloutCorrection, source_correction
from lit_rlhf.online.sources import Responses, RolloutSource, SampledModel, standalone
from lit_rlhf.types import PromptBatch, Rollout


class VLLMSampler(RolloutSource):
    """A vLLM engine colocated in this process (`lit_rlhf.generation.vllm`), holding a copy of
    the policy's weights (with LoRA: the base with the `policy` adapter merged), reloaded after
    every optimizer step. The update's log-probs are still the trainer's; the sampler's own are
    logged against them (`rollout/sampler_logprob_diff`).

    Args:
        engine_kwargs: keyword arguments of the engine (`VLLMEngine.from_policy`: `max_model_len`,
            `gpu_memory_utilization`, ... passed to `vllm.LLM`).
        tis_cap: truncated importance sampling: the policy-gradient term of each token weighed by
            min(pi_train / pi_sampler, tis_cap); the shorthand of `correction: {mode: truncate,
            level: token, upper: tis_cap}`. None or 0 = off.
        correction: the rollout correction (`lit_rlhf.online.correction.RolloutCorrection`:
            truncated or masked ratios per token, sequence or geometric mean; DeepSeek-V3.2's
            off-policy sequence mask); None = `tis_cap` decides. Not both.
    """

    runtime = ("engine",)

    def __init__(self, engine_kwargs: dict[str, Any] | None = None, tis_cap: float | None = None,
                 correction: RolloutCorrection | None = None) -> None:
        self.engine_kwargs = dict(engine_kwargs or {})
        self.correction = source_correction(tis_cap, correction)
        self.engine = None  # built on the first rollout

    def sample(self, model: SampledModel, batch: PromptBatch, repeats: int, sampling: SamplingConfig,
               training: bool = True) -> tuple[Rollout, dict[str, Tensor]]:
        """`RolloutSource.sample`; the stats: the seconds of the last weight-sync check, if any."""
        rollout, stats = super().sample(model, batch, repeats, sampling, training)
        probe = getattr(self.engine, "probe", None)
        if probe is not None:
            stats = {**stats, "time/weight_sync_check": torch.tensor(probe.seconds)}
        return rollout, stats

    def generate(self, model: SampledModel, prompt_ids: Tensor, prompt_mask: Tensor,
                 sampling: SamplingConfig) -> Responses:
        eos, pad = model.tokenizer.eos_token_id, model.tokenizer.pad_token_id
        return self.synced_engine(model).generate(prompt_ids, prompt_mask, sampling, eos, pad)

    def synced_engine(self, model: SampledModel):
        """The engine, built on first use, with `model`'s weights of its current version (a frozen
        model's: loaded once)."""
        from lit_rlhf.generation.vllm import VLLMEngine

        if self.engine is None:
            self.engine = VLLMEngine.from_policy(standalone(model.model), model.tokenizer, adapter=model.adapter,
                                                 **self.engine_kwargs)
            self.engine.synced_step = model.version
        elif self.engine.synced_step != model.version and not model.frozen:
            self.engine.sync_weights(model.model, model.version, adapter=model.adapter)
        return self.engine

    def sibling(self, name: str) -> "VLLMSampler":
        """An engine of its own for the frozen model `name`, with this one's settings (no correction)."""
        return VLLMSampler(self.engine_kwargs)
