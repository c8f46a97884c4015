"""Per-token log-probs of a causal LM on padded rows (`per_token_logps`), and what every log-prob
path shares: the output layer applied a chunk of scored tokens at a time, for the models it
reproduces (`decide_chunked`: once per model, at fit start or first use; a refusal warned), so the
logits of the whole batch never exist (`lit_rlhf.ops.linear_logprobs`); forwards under sharding.
"""

from __future__ import annotations

import logging
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_rlhf.ops.linear_logprobs import linear_token_logps
from lit_rlhf.ops.logprobs import position_ids_from_mask, token_logps_from_logits

log = logging.getLogger(__name__)

# config fields of Hugging Face models whose forward transforms the output layer's logits
# (Gemma 2/3 soft-capping, Cohere's logit_scale, Granite's logits_scaling)
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
_chunked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (decoder, output layer) or why not
_roots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its FSDP2 root (or None), after sharding


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
        del module.forward
        if own is not None:
            module.forward = own


def as_root_forward(model: nn.Module, fn, *args):
    """`fn(*args)` run as the forward of `model`'s FSDP2 root (`run_as_forward`; recorded by
    `decide_at_fit_start`, else searched), or plainly without one: the chunked path calls the
    decoder and the output layer itself, and the embedding, final norm and output layer are in the root's unit."""
    root = _roots[model] if model in _roots else sharded_root(model)
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


def decide_chunked(model: nn.Module, input_ids: Tensor) -> tuple[nn.Module, nn.Linear] | str:
    """(decoder, output layer) when the chunked path reproduces `model`'s logits, else the reason
    it does not (warned once per model): structure and config (`decoder_and_output_layer`), then
    a comparison on the first tokens of `input_ids` (`_probe`). Cached for `chunked_layers`."""
    found = decoder_and_output_layer(model)
    if not isinstance(found, str):
        found = _probe(model, *found, input_ids) or found
    if isinstance(found, str) and _chunked.get(model) != found:
        log.warning("log-probs of %s use the dense logits: %s", type(model).__name__, found)
    _chunked[model] = found
    return found


def decide_at_fit_start(model: nn.Module, input_ids: Tensor) -> None:
    """Decide what every step reads for `model` once its strategy placed and sharded it: its FSDP2
    root (`as_root_forward`; none before sharding) and the chunked path (`decide_chunked`: a
    forward that gathers ZeRO-3 and FSDP2 shards, so every rank calls it)."""
    root = _roots[model] = sharded_root(model)
    decide_chunked(model, input_ids)
    if root is not None:  # FSDP2 reshards a root after its backward: the probe's forward has none
        root.reshard()


def chunked_layers(model: nn.Module, input_ids: Tensor) -> tuple[nn.Module, nn.Linear] | None:
    """(decoder, output layer) when the chunked path reproduces `model`'s logits, else None; read
    from `decide_chunked`'s cache (decided here, probing `input_ids`, at a model's first use)."""
    found = _chunked[model] if model in _chunked else decide_chunked(model, input_ids)
    return None if isinstance(found, str) else found


def output_layer_logps(head: nn.Linear, hidden: Tensor, targets: Tensor, temperature: float, chunk_size: int,
                       top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Log-probs (S,) of `targets` (S,) from `hidden` (S, H) (`linear_token_logps`), computed as the
    output layer's forward (`run_as_forward`: ZeRO-3 gathers its weight)."""

    def forward(h: Tensor, t: Tensor) -> Tensor:
        return linear_token_logps(h, head.weight, head.bias, t, temperature, chunk_size, top_k, top_p)

    return run_as_forward(head, forward, hidden, targets)


def per_token_logps(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, temperature: float = 1.0,
                    chunk_size: int | None = None, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Per-token log-probs (B, T) of a (left- or right-padded) batch, 0 where `loss_mask` is False:
    `chunk_size` the chunked path, None dense logits from the position before the batch's first
    scored token on (`logits_to_keep`); `top_k` / `top_p` the sampler's filter, replayed."""
    layers = chunked_layers(model, input_ids) if chunk_size else None
    if layers is not None:
        decoder, head = layers
        scored = loss_mask.bool()[:, 1:]  # column t scores token t from position t - 1; column 0 never
        if not bool(scored.any()):
            return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)

        def chunked(input_ids: Tensor, attention_mask: Tensor, scored: Tensor) -> Tensor:
            hidden = forward_hidden(decoder, input_ids, attention_mask)[:, :-1]  # (B, T - 1, H)
            return output_layer_logps(head, hidden[scored], input_ids[:, 1:][scored], temperature, chunk_size, top_k, top_p)

        picked = as_root_forward(model, chunked, input_ids, attention_mask, scored)  # (S,)
        logps = torch.zeros(input_ids.shape, dtype=picked.dtype, device=picked.device)
        logps[:, 1:][scored] = picked
        return logps
    scored_columns = loss_mask.any(dim=0).nonzero()
    if scored_columns.numel() == 0:
        return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    first = max(1, int(scored_columns[0]))  # column 0 has no context and is never scored
    keep = input_ids.shape[1] - first + 1  # logits of positions first-1 .. T-1
    logits = forward_logits(model, input_ids, attention_mask, logits_to_keep=keep if first > 1 else 0)
    logps = token_logps_from_logits(logits, input_ids[:, first - 1:], temperature, top_k, top_p)[:, 1:]  # (B, T - first)
    logps = F.pad(logps, (first, 0), value=0.0)  # (B, T)
    return torch.where(loss_mask, logps, torch.zeros((), dtype=logps.dtype, device=logps.device))
