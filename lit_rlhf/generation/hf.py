"""The `hf` generation backend: `sample_tokens`, a KV-cache sampling loop drawing exactly the tokens
transformers' `generate` draws from the same random state (tested), and `generate_responses`,
its responses cut after the first EOS and PAD-filled (D23). Sharded strategies (ZeRO-3, FSDP)
need `synced_gpus=True` (`needs_synced_gpus`; `docs/ARCHITECTURE.md` section 4).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import Cache, DynamicCache, DynamicLayer

from lit_rlhf.generation.config import SamplingConfig, check_prompts, finish_responses
from lit_rlhf.ops.sampling import apply_temperature, filter_logits, filters


@torch.no_grad()
def generate_responses(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    config: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    synced_gpus: bool = False,
    generator: torch.Generator | None = None,
    return_logps: bool = False,
) -> tuple[Tensor, ...]:
    """(response_ids (B, R), response_mask (B, R), has_eos (B,)) sampled after left-padded
    prompts (B, P), R = `config.max_new_tokens`, cut after the first EOS and PAD-filled (D23);
    with `return_logps`, also the sampler's log-prob of each kept token (B, R), 0 elsewhere
    (`sample_tokens` for `generator`)."""
    check_prompts(prompt_mask, eos_token_id, pad_token_id)
    was_training = model.training
    model.eval()
    try:
        sampled = sample_tokens(model, prompt_ids, prompt_mask, config, eos_token_id, pad_token_id, synced_gpus,
                                generator=generator, return_logps=return_logps)
    finally:
        model.train(was_training)
    tokens, logps = sampled if return_logps else (sampled, None)
    return finish_responses(tokens, config.max_new_tokens, eos_token_id, pad_token_id, logps)


def _all_ranks_done(done: bool, device: torch.device) -> bool:
    """True when every rank's rows are finished (one all-reduce; ZeRO-3 / FSDP generation)."""
    import torch.distributed as dist

    flag = torch.tensor(0.0 if done else 1.0, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.SUM)
    return float(flag) == 0.0


class _PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers (B, H, L, D) allocated once: each forward writes in
    place and attention reads the filled prefix, where `DynamicLayer` copies the whole cache at
    every token; `batch_select_indices` keeps some rows."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length, self.filled = length, 0

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            b, h, _, _ = key_states.shape
            self.key_buffer = key_states.new_zeros(b, h, self.length, key_states.shape[-1])
            self.value_buffer = value_states.new_zeros(b, h, self.length, value_states.shape[-1])
        end = self.filled + key_states.shape[-2]
        self.key_buffer[:, :, self.filled:end] = key_states
        self.value_buffer[:, :, self.filled:end] = value_states
        self.filled = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        self.keys, self.values = self.key_buffer[:, :, :self.filled], self.value_buffer[:, :, :self.filled]


def _decode_cache(model: nn.Module, length: int) -> tuple[object, bool]:
    """(cache, preallocated): a cache of `_PreallocatedLayer`s for a model with full attention in
    every layer; otherwise (sliding windows, linear attention) the model's own dynamic cache."""
    config = model.config.get_text_config(decoder=True)
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    if getattr(config, "sliding_window", None) is None and set(types) == {"full_attention"}:
        return Cache(layers=[_PreallocatedLayer(length) for _ in types]), True
    return DynamicCache(config=config), False


@torch.no_grad()
def sample_tokens(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    config: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    synced_gpus: bool = False,
    generator: torch.Generator | None = None,
    return_logps: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Up to `max_new_tokens` new tokens (B, R' <= R) after left-padded prompts (positions count
    real tokens, D5), with a KV cache allocated once (`_PreallocatedLayer`).

    One prefill (rows with the same prompt share it), then one single-token forward per token. A
    row past its EOS continues with PAD; once at most 3/4 of the rows in the forward passes still
    run, the batch and cache are compacted to them; the loop stops when every row (under
    `synced_gpus`, every rank's) has finished. The draw is `torch.multinomial`'s for one sample,
    argmax(p / q) with q ~ Exp(1) drawn for all B rows from `generator` (default torch's global
    stream), so compacting changes no token. The model's `generation_config` is ignored: the
    distribution sampled is the one the log-probs score. `return_logps`: also the log-prob
    (B, R') of each token under the distribution it was drawn from (vLLM's `processed_logprobs`),
    for an off-policy correction (`lit_rlhf.losses.rollout_correction`).
    """
    batch = prompt_ids.shape[0]
    attention_mask = prompt_mask.long()  # (B, P)
    positions = (attention_mask.cumsum(dim=1) - 1).masked_fill(attention_mask == 0, 1)  # (B, P)
    cache, preallocated = _decode_cache(model, prompt_ids.shape[1] + config.max_new_tokens)
    # without left padding no mask is needed: the model's causal attention is the same, minus
    # the per-call mask handling (a third of a decoding step for a small model on CPU)
    unpadded = bool(prompt_mask.all())
    # rows with the same prompt (GRPO's G copies) share one prefill: its cache rows and logits are copied
    unique, inverse = torch.unique(torch.cat([prompt_ids, attention_mask], dim=1), dim=0, return_inverse=True)
    shared = unique.shape[0] < batch
    rows = slice(None)
    if shared:  # a row of each unique prompt (any: they are the same)
        rows = inverse.new_zeros(unique.shape[0]).scatter_(0, inverse, torch.arange(batch, device=inverse.device))
    out = model(input_ids=prompt_ids[rows], attention_mask=None if unpadded else attention_mask[rows],
                position_ids=positions[rows], past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1]
    if shared:
        cache.batch_select_indices(inverse)
        logits = logits[inverse]
    if not unpadded:  # the mask of the whole sequence; for SDPA already the (B, 1, 1, L) bool mask transformers
        # would rebuild from the 2D one at every token (True = attend)
        attention_mask = torch.cat([prompt_mask, prompt_mask.new_ones(batch, config.max_new_tokens)], dim=1)
        if preallocated and getattr(model.config, "_attn_implementation", None) == "sdpa":
            attention_mask = attention_mask[:, None, None, :]
    live = torch.arange(batch, device=prompt_ids.device)  # the full batch's rows in the forward passes
    position = positions[:, -1:]  # (b, 1), of the live rows
    unfinished = torch.ones(batch, dtype=torch.bool, device=prompt_ids.device)  # (b,): live rows before their EOS
    tokens: list[Tensor] = []
    logps: list[Tensor] = []
    done, length = False, prompt_ids.shape[1]  # length: the cache's, prompt and decoding forwards
    while True:
        if not done:
            logits = logits.to(dtype=torch.float32, copy=True)  # (b, V)
            if config.do_sample:
                scores = (filter_logits(logits, config.temperature, config.top_k, config.top_p)
                          if filters(config.top_k, config.top_p) else apply_temperature(logits, config.temperature))
                noise = torch.empty((batch, scores.shape[1]), dtype=scores.dtype, device=scores.device)
                noise = noise.exponential_(1, generator=generator)  # (B, V): multinomial's draws for every row
                picked = (scores.softmax(dim=-1) / (noise if live.shape[0] == batch else noise[live])).argmax(dim=-1)
            else:
                scores = logits
                picked = logits.argmax(dim=-1)  # (b,)
            if return_logps:
                logps.append(torch.zeros(batch, device=live.device).index_copy_(
                    0, live, scores.log_softmax(dim=-1).gather(1, picked[:, None]).squeeze(1)))  # (B,)
            picked = torch.where(unfinished, picked, pad_token_id)  # a row past its EOS continues with PAD
            tokens.append(torch.full((batch,), pad_token_id, device=live.device).index_copy_(0, live, picked))
            unfinished &= picked != eos_token_id
            running = int(unfinished.sum())  # the step's one host sync
            done = len(tokens) == config.max_new_tokens or running == 0
        # every rank takes the same decision here, so all make the same number of forward passes
        if _all_ranks_done(done, prompt_ids.device) if synced_gpus else done:
            break
        if 0 < running <= live.shape[0] * 3 // 4:  # compact: the rows still running, their cache and state
            keep = unfinished.nonzero().squeeze(1)
            live, position, unfinished, picked = live[keep], position[keep], unfinished[keep], picked[keep]
            cache.batch_select_indices(keep)
        # the next forward: the token just sampled (a finished rank repeats its last one for its peers)
        position, length = position + 1, length + 1
        out = model(input_ids=picked[:, None], attention_mask=None if unpadded else attention_mask[live, ..., :length],
                    position_ids=position, past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1]
    if return_logps:
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)
    return torch.stack(tokens, dim=1)
