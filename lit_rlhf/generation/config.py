"""What every generation backend (`hf`, `vllm`) shares: the sampling settings, the checks on the
prompts, the post-processing of sampled tokens (D23, `finish_responses`) and decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rlhf.ops import truncate_after_eos


@dataclass(frozen=True)
class SamplingConfig:
    """How responses are sampled.

    Args:
        max_new_tokens: response length R (TL;DR: 53, N+ Table 7).
        temperature: sampling temperature (`lit_rlhf.ops.apply_temperature`), > 0 when sampling;
            the log-probs' own is `OnlineModule`'s `logprob_temperature`.
        top_k: keep the k most likely tokens (0 = off).
        top_p: nucleus sampling mass (1.0 = off).
        do_sample: False for greedy decoding (`SamplingConfig.greedy`): `temperature`, `top_k`
            and `top_p` are then not used.
    """

    max_new_tokens: int = 53
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    do_sample: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature} (greedy decoding: "
                             "do_sample false)")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @classmethod
    def greedy(cls, max_new_tokens: int = 53) -> "SamplingConfig":
        """Greedy decoding of `max_new_tokens` tokens (ReMax's baseline, evaluation at temperature 0)."""
        return cls(max_new_tokens=max_new_tokens, temperature=0.0, do_sample=False)


def check_prompts(prompt_mask: Tensor, eos_token_id: int, pad_token_id: int) -> None:
    """Raise a clear error when PAD equals EOS (D3) or the prompts are not left padded (D5)."""
    if eos_token_id == pad_token_id:
        raise ValueError("PAD must differ from EOS (D3): load the tokenizer with lit_rlhf.models.load_tokenizer")
    if prompt_mask.shape[1] and not bool(prompt_mask[:, -1].all()):
        raise ValueError("prompts must be left padded (D5): the last column of the prompt mask has padding")


def finish_responses(responses: Tensor, max_new_tokens: int, eos_token_id: int, pad_token_id: int,
                     logps: Tensor | None = None) -> tuple[Tensor, ...]:
    """Sampled tokens (B, R' <= R) -> (response_ids (B, R), response_mask (B, R), has_eos (B,)):
    PAD-filled to R = `max_new_tokens` and cut after the first EOS (D23); with the sampler's
    `logps` (B, R'), also them (B, R), 0 outside the mask."""
    fill = (0, max_new_tokens - responses.shape[1])
    ids, mask, has_eos = truncate_after_eos(torch.nn.functional.pad(responses, fill, value=pad_token_id),
                                            eos_token_id, pad_token_id)
    if logps is None:
        return ids, mask, has_eos
    return ids, mask, has_eos, torch.nn.functional.pad(logps, fill).masked_fill(~mask, 0.0)


def needs_synced_gpus(trainer) -> bool:
    """True when the strategy shards parameters across ranks (DeepSpeed ZeRO-3, FSDP, FSDP2)."""
    if trainer is None or trainer.world_size <= 1:
        return False
    strategy = trainer.strategy
    zero_stage = getattr(strategy, "config", None) or {}
    if isinstance(zero_stage, dict) and zero_stage.get("zero_optimization", {}).get("stage", 0) == 3:
        return True
    from lightning.pytorch.strategies import ModelParallelStrategy  # FSDP2 (lit_rlhf.training.sharding)

    return type(strategy).__name__.startswith("FSDP") or isinstance(strategy, ModelParallelStrategy)


def decode_responses(tokenizer, response_ids: Tensor, response_mask: Tensor) -> list[str]:
    """Response texts without EOS and padding."""
    texts = []
    for ids, mask in zip(response_ids.tolist(), response_mask.tolist()):
        kept = [t for t, m in zip(ids, mask) if m and t != tokenizer.eos_token_id]
        texts.append(tokenizer.decode(kept, skip_special_tokens=False))
    return texts
