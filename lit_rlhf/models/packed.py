"""Per-token log-probs of packed rows (`lit_rlhf.types.PackedSFTBatch`): several examples end to
end in one row, position ids restarting at 0 at each example, no attention mask.

Models built on `transformers.masking_utils` (Llama, SmolLM2, Qwen2, GPT-NeoX, ...) detect the
examples from the position restarts and attend within each one; `sdpa_varlen`
(`lit_rlhf.models.attention`) gets the boundaries instead. `packing_supported` probes this once
per model and attention implementation; a model that does not keep examples apart is refused
here, and `SFTModule` unpacks the batch for it. Both log-prob paths of `lit_rlhf.models.logprobs`
apply (chunked and dense); a token at position 0 (an example's first) is never scored.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import Tensor, nn

from lit_rlhf.models.attention import SDPA_VARLEN, boundaries_from_positions, boundaries_given
from lit_rlhf.models.output_layer import as_root_forward, chunked_layers, output_layer_logps
from lit_rlhf.ops.logprobs import token_logps_from_logits

log = logging.getLogger(__name__)

_packing_support: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {attn impl: bool}


def attention_implementation(model: nn.Module) -> str:
    """The attention kernel a Hugging Face model runs (`sdpa`, `eager`, `flash_attention_2`, ...)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or getattr(config, "attn_implementation", None) or "unknown")


def _packed_forward(module: nn.Module, input_ids: Tensor, position_ids: Tensor):
    """`module` on packed rows; a model running `sdpa_varlen` gets the example boundaries instead
    of a block-diagonal mask (`_probe` checks that its attention calls do receive them)."""
    if attention_implementation(module) != SDPA_VARLEN:
        return module(input_ids=input_ids, attention_mask=None, position_ids=position_ids, use_cache=False)
    with boundaries_given():
        return module(input_ids=input_ids, attention_mask=None, position_ids=position_ids, use_cache=False,
                      **boundaries_from_positions(position_ids))


@torch.no_grad()
def _probe(model: nn.Module) -> bool:
    """Logits of a row packing two sequences == each sequence's own logits (rtol/atol 1e-3)?"""
    device = next(model.parameters()).device
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0) or 2
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, vocab, (1, 5), generator=gen).to(device)
    b = torch.randint(0, vocab, (1, 4), generator=gen).to(device)
    ids = torch.cat([a, b], dim=1)
    positions = torch.cat([torch.arange(5), torch.arange(4)]).unsqueeze(0).to(device)
    was_training = model.training
    model.eval()
    try:
        packed = _packed_forward(model, ids, positions).logits.float()
        alone = [model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False).logits.float() for x in (a, b)]
    finally:
        model.train(was_training)
    return bool(torch.allclose(packed, torch.cat(alone, dim=1), rtol=1e-3, atol=1e-3))


def packing_supported(model: nn.Module) -> bool:
    """Whether `model` attends within each packed example only (probed once per model and
    attention implementation; a refusal is logged)."""
    impl = attention_implementation(model)
    seen = _packing_support.setdefault(model, {})
    if impl not in seen:
        seen[impl] = _probe(model)
        if not seen[impl]:
            log.warning("%s (attention %s) attends across packed examples: its packed batches are unpacked "
                        "(padded) instead", type(model).__name__, impl)
    return seen[impl]


def packed_token_logps(model: nn.Module, input_ids: Tensor, position_ids: Tensor, loss_mask: Tensor,
                       temperature: float = 1.0, chunk_size: int | None = None, top_k: int = 0,
                       top_p: float = 1.0) -> Tensor:
    """Per-token log-probs (R, L) of packed rows, 0 where `loss_mask` is False and at position 0.

    `chunk_size`: the chunked path (`lit_rlhf.ops.linear_logprobs`); None: dense logits. `top_k` /
    `top_p`: the sampler's filter, replayed (`lit_rlhf.ops.sampling`).
    Raises ValueError for a model that attends across packed examples (`packing_supported`).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids.shape != position_ids.shape or input_ids.shape != loss_mask.shape:
        raise ValueError(f"input_ids, position_ids and loss_mask must have one shape, got {tuple(input_ids.shape)}, "
                         f"{tuple(position_ids.shape)}, {tuple(loss_mask.shape)}")
    if not packing_supported(model):
        raise ValueError(f"{type(model).__name__} with attention {attention_implementation(model)!r} attends across "
                         "packed examples; use padded batches (packing: false)")
    scored = loss_mask.bool() & (position_ids != 0)
    if not bool(scored.any()):
        return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    layers = chunked_layers(model, input_ids) if chunk_size else None
    if layers is not None:
        decoder, head = layers

        def chunked(input_ids: Tensor, position_ids: Tensor, scored: Tensor) -> Tensor:  # as the FSDP2 root's forward
            out = _packed_forward(decoder, input_ids, position_ids)
            hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # (R, L, H)
            return output_layer_logps(head, hidden[:, :-1][scored], input_ids[:, 1:][scored], temperature, chunk_size,
                                      top_k, top_p)

        picked = as_root_forward(model, chunked, input_ids, position_ids, scored[:, 1:])  # (S,)
        logps = torch.zeros(input_ids.shape, dtype=picked.dtype, device=picked.device)
        logps[:, 1:][scored[:, 1:]] = picked
        return logps
    logits = _packed_forward(model, input_ids, position_ids).logits
    logps = token_logps_from_logits(logits, input_ids, temperature, top_k, top_p)
    return torch.where(scored, logps, torch.zeros((), dtype=logps.dtype, device=logps.device))
