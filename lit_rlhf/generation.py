"""No-grad sampling from left-padded prompts, and the log-probs of what was sampled.

`generate_responses` samples up to `max_new_tokens` tokens per prompt and applies D23: each
response is cut after its first EOS and PAD-filled to exactly `max_new_tokens`, and `has_eos`
records which responses ended. (Generation stops early once every row has emitted EOS: the
tokens after a row's first EOS are discarded by D23 anyway, so this changes no response.)

`sequence_token_logps` scores the sampled tokens under a model with the same temperature the
sampler used (the logits are divided once, in `lit_rlhf.ops.token_logps_from_logits`), with
position ids that are right under left padding, in micro-batches.

Under sharded strategies (ZeRO-3, FSDP) every rank must keep calling the model until all ranks
are done: pass `synced_gpus=True` (DESIGN.md section 3); `needs_synced_gpus` tells when.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lit_rlhf.ops import response_logps, truncate_after_eos


@dataclass(frozen=True)
class SamplingConfig:
    """How responses are sampled.

    Args:
        max_new_tokens: response length R (TL;DR: 53, N+ Table 7).
        temperature: sampling temperature; also divides the logits when log-probs are computed.
        top_k: keep the k most likely tokens (0 = off).
        top_p: nucleus sampling mass (1.0 = off).
        do_sample: False for greedy decoding (temperature then only affects log-probs, set it to 1).
    """

    max_new_tokens: int = 53
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    do_sample: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


def needs_synced_gpus(trainer) -> bool:
    """True when the strategy shards parameters across ranks (DeepSpeed ZeRO-3, FSDP)."""
    if trainer is None or trainer.world_size <= 1:
        return False
    strategy = trainer.strategy
    zero_stage = getattr(strategy, "config", None) or {}
    if isinstance(zero_stage, dict) and zero_stage.get("zero_optimization", {}).get("stage", 0) == 3:
        return True
    return type(strategy).__name__.startswith("FSDP")


@torch.no_grad()
def generate_responses(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    config: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    synced_gpus: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample responses for left-padded prompts (B, P).

    Returns (response_ids (B, R), response_mask (B, R) bool, has_eos (B,) bool) with R =
    `config.max_new_tokens`, cut after the first EOS and PAD-filled (D23).
    """
    if eos_token_id == pad_token_id:
        raise ValueError("PAD must differ from EOS (D3): load the tokenizer with lit_rlhf.models.load_tokenizer")
    if prompt_mask.shape[1] and not bool(prompt_mask[:, -1].all()):
        raise ValueError("prompts must be left padded (D5): the last column of the prompt mask has padding")
    was_training = model.training
    model.eval()
    try:
        sampling = {"do_sample": True, "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p}
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask.long(),
            max_new_tokens=config.max_new_tokens,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            use_cache=True,
            synced_gpus=synced_gpus,
            **(sampling if config.do_sample else {"do_sample": False, "top_k": None, "top_p": None, "temperature": None}),
        )
    finally:
        model.train(was_training)
    responses = out[:, prompt_ids.shape[1]:]
    missing = config.max_new_tokens - responses.shape[1]
    if missing > 0:
        responses = torch.nn.functional.pad(responses, (0, missing), value=pad_token_id)
    return truncate_after_eos(responses, eos_token_id, pad_token_id)


@torch.no_grad()
def sequence_token_logps(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
) -> Tensor:
    """Log-probs (B, R) of the response tokens under `model`, 0 where `response_mask` is False."""
    return token_logps_with_grad(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature, micro_batch_size)


def token_logps_with_grad(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
) -> Tensor:
    """As `sequence_token_logps`, differentiable (for the policy update)."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    size = micro_batch_size or input_ids.shape[0]
    chunks = []
    for start in range(0, input_ids.shape[0], size):
        sl = slice(start, start + size)
        chunks.append(response_logps(model, input_ids[sl], attention_mask[sl], response_ids.shape[1], temperature))
    logps = torch.cat(chunks)
    return torch.where(response_mask, logps, torch.zeros((), dtype=logps.dtype, device=logps.device))


def decode_responses(tokenizer, response_ids: Tensor, response_mask: Tensor) -> list[str]:
    """Response texts without EOS and padding."""
    texts = []
    for ids, mask in zip(response_ids.tolist(), response_mask.tolist()):
        kept = [t for t, m in zip(ids, mask) if m and t != tokenizer.eos_token_id]
        texts.append(tokenizer.decode(kept, skip_special_tokens=False))
    return texts
