"""Per-token log-probs of a causal LM, right under left and right padding (D5).

Two paths give the same numbers. The dense one asks the model for its logits (B, T', V) and
takes a log-softmax (`lit_rlhf.ops.logprobs`). The chunked one (`chunk_size` set) runs the model's
decoder to its last hidden states and applies the output layer a chunk of scored tokens at a time
(`lit_rlhf.ops.linear_logprobs`), so the logits of the whole batch never exist: only the scored
positions reach the output layer, and at most `chunk_size` rows of logits live at once, in the
forward and in the backward pass. Models whose logits are not the output layer applied to the
last hidden state (a final logit soft-cap or scale, a non-`nn.Linear` output layer) use the dense
path, with a warning naming the reason, once per model. Both replay the sampler's `top_k` / `top_p`
on the model's own logits when given (`lit_rlhf.ops.sampling`: the policy's log-probs are of the
distribution sampled; a reference's are taken without them, over the full vocabulary).
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
_chunked_support: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> None (ok) or why not


def forward_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int = 0) -> Tensor:
    """Run a causal LM with position ids derived from the mask; (B, T) -> (B, T', V).

    `logits_to_keep > 0` asks the model for the logits of the last that many positions only.
    """
    kwargs = {}
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        **kwargs,
    )
    return out.logits


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
    out = decoder(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def sharded_root(model: nn.Module) -> nn.Module | None:
    """The outermost FSDP2 unit of `model` (`torch.distributed.fsdp.fully_shard`; the transformers
    model inside a `peft` wrapper), or None when nothing in it is sharded."""
    from torch.distributed.fsdp import FSDPModule

    return next((m for m in model.modules() if isinstance(m, FSDPModule)), None)


def as_root_forward(model: nn.Module, fn, *args):
    """`fn(*args)`, run as the forward of `model`'s FSDP2 root when it has one.

    The chunked path calls the decoder and the output layer itself. Under FSDP2 the embedding,
    the final norm and the output layer belong to the root's unit, gathered only around the root's
    forward, whose hooks also reduce their gradients after the backward pass: so the computation
    runs as that forward (its `__call__` with `fn` in place of `forward`), as `output_layer_logps`
    does for the output layer under ZeRO-3. Without a sharded root: `fn(*args)`."""
    root = sharded_root(model)
    if root is None:
        return fn(*args)
    own = root.__dict__.get("forward")
    root.forward = fn
    try:
        return root(*args)
    finally:
        if own is None:
            del root.forward
        else:
            root.forward = own


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
    """(decoder, output layer) when the chunked path reproduces `model`'s logits, else None.

    Decided once per model (structure, config, then a few-token comparison); a refusal is logged.
    """
    if model not in _chunked_support:
        found = decoder_and_output_layer(model)
        reason = found if isinstance(found, str) else _probe(model, *found, input_ids)
        if reason is not None:
            log.warning("log-probs of %s use the dense logits: %s", type(model).__name__, reason)
        _chunked_support[model] = reason
    if _chunked_support[model] is not None:
        return None
    found = decoder_and_output_layer(model)
    return None if isinstance(found, str) else found


def output_layer_logps(head: nn.Linear, hidden: Tensor, targets: Tensor, scored: Tensor, temperature: float, chunk_size: int,
                       top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Log-probs (B, T) of `targets` at the `scored` positions of `hidden` (B, T, H), 0 elsewhere.

    The chunked computation runs as the output layer's forward (its `__call__`), so module hooks
    that gather a sharded weight (DeepSpeed ZeRO-3) fire around it in forward and backward.
    """

    def forward(h: Tensor, t: Tensor) -> Tensor:
        return linear_token_logps(h, head.weight, head.bias, t, temperature, chunk_size, top_k=top_k, top_p=top_p)[0]

    own = head.__dict__.get("forward")
    head.forward = forward
    try:
        picked = head(hidden[scored], targets[scored])  # (N,)
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
    out = torch.zeros(scored.shape, dtype=picked.dtype, device=picked.device)
    out[scored] = picked
    return out


def per_token_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """Per-token log-probs (B, T) of a (left- or right-padded) batch, 0 where `loss_mask` is False.

    `chunk_size`: the chunked path (only the scored positions reach the output layer, at most
    `chunk_size` of them at a time); None: dense logits, computed only from the position before
    the batch's first scored token onwards (`logits_to_keep`). `top_k` / `top_p`: the sampler's
    filter, replayed (`lit_rlhf.ops.sampling`).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    layers = chunked_layers(model, input_ids) if chunk_size else None
    if layers is not None:
        decoder, head = layers
        scored = loss_mask.bool()[:, 1:]  # column t scores token t from position t - 1; column 0 never
        if not bool(scored.any()):
            return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)

        def chunked(input_ids: Tensor, attention_mask: Tensor, scored: Tensor) -> Tensor:
            hidden = forward_hidden(decoder, input_ids, attention_mask)  # (B, T, H)
            return output_layer_logps(head, hidden[:, :-1], input_ids[:, 1:], scored, temperature, chunk_size, top_k, top_p)

        logps = as_root_forward(model, chunked, input_ids, attention_mask, scored)  # (B, T - 1)
        return F.pad(logps, (1, 0), value=0.0)
    scored_columns = loss_mask.any(dim=0).nonzero()
    if scored_columns.numel() == 0:
        return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    first = max(1, int(scored_columns[0]))  # column 0 has no context and is never scored
    keep = input_ids.shape[1] - first + 1  # logits of positions first-1 .. T-1
    logits = forward_logits(model, input_ids, attention_mask, logits_to_keep=keep if first > 1 else 0)
    logps = token_logps_from_logits(logits, input_ids[:, first - 1:], temperature, top_k, top_p)[:, 1:]  # (B, T - first)
    logps = F.pad(logps, (first, 0), value=0.0)  # (B, T)
    return torch.where(loss_mask, logps, torch.zeros((), dtype=logps.dtype, device=logps.device))


def response_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_length: int,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """Log-probs (B, R) of the last `response_length` tokens of left-padded prompt+response rows
    (`top_k` / `top_p` replayed as in `per_token_logps`).

    Only R+1 positions of logits are computed (the prompt's logits are never materialised).
    Positions past the response mask are left to the caller to mask (the chunked path,
    `chunk_size` set, gives 0 there and skips them).
    """
    layers = chunked_layers(model, input_ids) if chunk_size else None
    if layers is not None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        decoder, head = layers
        scored = attention_mask.bool()[:, -response_length:]  # (B, R)
        if not bool(scored.any()):
            return torch.zeros(scored.shape, dtype=torch.float32, device=input_ids.device)

        def chunked(input_ids: Tensor, attention_mask: Tensor, scored: Tensor) -> Tensor:
            hidden = forward_hidden(decoder, input_ids, attention_mask)  # (B, T, H)
            context = hidden[:, -(response_length + 1):-1]  # position t - 1 predicts token t
            return output_layer_logps(head, context, input_ids[:, -response_length:], scored, temperature, chunk_size,
                                      top_k, top_p)

        return as_root_forward(model, chunked, input_ids, attention_mask, scored)  # (B, R)
    logits = forward_logits(model, input_ids, attention_mask, logits_to_keep=response_length + 1)
    logps = token_logps_from_logits(logits, input_ids[:, -(response_length + 1):], temperature, top_k, top_p)
    return logps[:, 1:]
