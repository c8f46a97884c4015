"""A causal LM's output layer applied a chunk of scored tokens at a time
(`lit_rlhf.ops.linear_logprobs`), so the logits of the whole batch never exist: which models it
reproduces (`chunked_layers`: not those whose logits are not `output_layer(last hidden state)`,
a logit soft-cap or scale, a non-`nn.Linear` head; a refusal warned once per model), and how it
runs under sharding (the output layer's and the FSDP2 root's forwards, `run_as_forward`). Used by
every log-prob path: padded (`lit_rlhf.models.logprobs`), shared-prompt, packed, distillation.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import Tensor, nn

from lit_rlhf.ops.linear_logprobs import linear_token_logps
from lit_rlhf.ops.logprobs import position_ids_from_mask

log = logging.getLogger(__name__)

# config fields of Hugging Face models whose forward transforms the output layer's logits
# (Gemma 2/3 soft-capping, Cohere's logit_scale, Granite's logits_scaling)
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
_chunked_support: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> None (ok) or why not


def forward_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int = 0) -> Tensor:
    """Logits (B, T', V) of a causal LM, position ids from the mask; `logits_to_keep > 0`: only
    the last that many positions'."""
    kwargs = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
    return model(input_ids=input_ids, attention_mask=attention_mask.long(),
                 position_ids=position_ids_from_mask(attention_mask), use_cache=False, **kwargs).logits


def decoder_and_output_layer(model: nn.Module) -> tuple[nn.Module, nn.Linear] | str:
    """(decoder, output layer) of a causal LM whose logits are `output_layer(decoder(...)[0])`,
    or the reason the chunked path cannot reproduce its logits."""
    get_decoder = getattr(model, "get_decoder", None)
    get_output = getattr(model, "get_output_embeddings", None)
    if not callable(get_decoder) or not callable(get_output):
        return f"{type(model).__name__} has no get_decoder/get_output_embeddings"
    decoder, head = get_decoder(), get_output()
    if decoder is None or decoder is model:
        return f"{type(model).__name__} exposes no separate decoder"
    if type(head) is not nn.Linear:
        return f"its output layer is a {type(head).__name__}, not a plain nn.Linear"
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    for field in _LOGIT_TRANSFORMS:
        value = getattr(config, field, None)
        if value is not None and value != 1.0:
            return f"its forward transforms the logits (config.{field} = {value})"
    return decoder, head


def forward_hidden(decoder: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Last hidden states (B, T, H) of a causal LM's decoder, position ids from the mask."""
    out = decoder(input_ids=input_ids, attention_mask=attention_mask.long(),
                  position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def sharded_root(model: nn.Module) -> nn.Module | None:
    """The outermost FSDP2 unit of `model` (`torch.distributed.fsdp.fully_shard`; the transformers
    model inside a `peft` wrapper), or None when nothing in it is sharded."""
    from torch.distributed.fsdp import FSDPModule

    return next((m for m in model.modules() if isinstance(m, FSDPModule)), None)


def run_as_forward(module: nn.Module, fn, *args):
    """`module(*args)` with `fn` in place of its `forward`: the module's hooks (ZeRO-3 and FSDP2
    gather its sharded weights around the forward and reduce their gradients after the backward)
    fire around `fn`."""
    own = module.__dict__.get("forward")
    module.forward = fn
    try:
        return module(*args)
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def as_root_forward(model: nn.Module, fn, *args):
    """`fn(*args)` run as the forward of `model`'s FSDP2 root (`run_as_forward`), or plainly
    without one: the chunked path calls the decoder and the output layer itself, and under FSDP2
    the embedding, final norm and output layer belong to the root's unit."""
    root = sharded_root(model)
    return fn(*args) if root is None else run_as_forward(root, fn, *args)


@torch.no_grad()
def _probe(model: nn.Module, decoder: nn.Module, head: nn.Linear, input_ids: Tensor) -> str | None:
    """Compare the model's logits with `head(decoder(...))` on a few tokens: catches a final
    logit transform that no config field announces."""
    ids = input_ids[:1, :8]
    mask = torch.ones_like(ids)
    full = forward_logits(model, ids, mask).float()
    mine = as_root_forward(model, lambda i, m: head(forward_hidden(decoder, i, m)), ids, mask).float()
    if torch.allclose(mine, full, rtol=1e-3, atol=1e-3):
        return None
    return f"its logits differ from the output layer applied to the decoder's last hidden state (max {float((mine - full).abs().max()):.3g})"


def chunked_layers(model: nn.Module, input_ids: Tensor) -> tuple[nn.Module, nn.Linear] | None:
    """(decoder, output layer) when the chunked path reproduces `model`'s logits, else None;
    decided once per model (structure, config, then a few-token comparison), a refusal logged."""
    if model not in _chunked_support:
        found = decoder_and_output_layer(model)
        reason = found if isinstance(found, str) else _probe(model, *found, input_ids)
        if reason is not None:
            log.warning("log-probs of %s use the dense logits: %s", type(model).__name__, reason)
        _chunked_support[model] = reason
    found = decoder_and_output_layer(model) if _chunked_support[model] is None else None
    return None if isinstance(found, str) else found


def output_layer_logps(head: nn.Linear, hidden: Tensor, targets: Tensor, scored: Tensor, temperature: float, chunk_size: int,
                       top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Log-probs (B, T) of `targets` at the `scored` positions of `hidden` (B, T, H), 0 elsewhere,
    computed as the output layer's forward (`run_as_forward`: ZeRO-3 gathers its weight)."""

    def forward(h: Tensor, t: Tensor) -> Tensor:
        return linear_token_logps(h, head.weight, head.bias, t, temperature, chunk_size, top_k=top_k, top_p=top_p)[0]

    picked = run_as_forward(head, forward, hidden[scored], targets[scored])  # (N,)
    out = torch.zeros(scored.shape, dtype=picked.dtype, device=picked.device)
    out[scored] = picked
    return out
