"""A policy's completions of the evaluation prompts (our KV-cache sampler, or a vLLM engine)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lit_rlhf.generation import SamplingConfig, decode_responses, generate_responses

GREEDY = SamplingConfig(max_new_tokens=53, temperature=1.0, do_sample=False)


def generate_completions(model: torch.nn.Module, tokenizer: Any, prompt_ids: Sequence[Sequence[int]],
                         sampling: SamplingConfig = GREEDY, batch_size: int = 8, synced_gpus: bool = False,
                         seed: int = 0, engine: Any = None, response_ids: list[list[int]] | None = None) -> list[str]:
    """Completion texts (EOS and padding removed) of `model` for each prompt, in order, sampled in
    left-padded batches (D5, D23) under a forked RNG seeded with `seed` (reproducible, the training
    RNG untouched). `response_ids`: a list that gets each completion's sampled ids (EOS included
    when it ended). `engine`: a `VLLMEngine` holding `model`'s weights samples instead."""
    from lit_rlhf.data.collate import pad_left

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    texts: list[str] = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for start in range(0, len(prompt_ids), batch_size):
            ids, mask = pad_left(prompt_ids[start : start + batch_size], tokenizer.pad_token_id)  # (b, P)
            if engine is not None:
                ids_out, response_mask, _, _ = engine.generate(ids, mask, sampling, tokenizer.eos_token_id,
                                                               tokenizer.pad_token_id)  # (b, R)
            else:
                ids_out, response_mask, _ = generate_responses(
                    model, ids.to(device), mask.to(device), sampling, tokenizer.eos_token_id, tokenizer.pad_token_id,
                    synced_gpus=synced_gpus,
                )  # (b, R)
            texts.extend(decode_responses(tokenizer, ids_out.cpu(), response_mask.cpu()))
            if response_ids is not None:
                response_ids.extend([t for t, m in zip(row, keep) if m]
                                    for row, keep in zip(ids_out.tolist(), response_mask.tolist()))
    return texts
