"""Attention over packed rows, one packed example at a time (`sdpa_varlen`).

`scaled_dot_product_attention` with the block-diagonal mask of a packed row computes every
(query, key) pair of the row and masks most away (16 TL;DR examples in one row: 9.4x the pairs of
the padded batch, `benchmarks/RESULTS.md`). Given the example boundaries (`cu_seq_lens_q/k`, as
transformers passes them to `flash_attention_2`), `sdpa_varlen` runs one causal `sdpa` call per
example, on any device. It is registered with transformers (`AttentionInterface`, and `sdpa`'s
mask function) and is plain `sdpa` for every call without boundaries (padded batches, a KV cache,
4D shared-prompt masks); `use_varlen_attention(model)` switches a model to it. A forward run
`with boundaries_given():` builds no attention mask (rows x length^2 booleans). Values equal
`sdpa` with the block mask up to rounding (`tests/models/test_attention.py`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import weakref
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)

SDPA_VARLEN = "sdpa_varlen"
_NO_MASK = contextvars.ContextVar("lit_rlhf_sdpa_varlen_no_mask", default=False)


@contextlib.contextmanager
def boundaries_given() -> Iterator[None]:
    """Inside: `sdpa_varlen` models build no attention mask (the forward passes the example
    boundaries instead). Masks are built in the model's forward only, so a recomputation under
    gradient checkpointing, later, reuses what the forward built."""
    token = _NO_MASK.set(True)
    try:
        yield
    finally:
        _NO_MASK.reset(token)


def _mask(*args, **kwargs):
    """`sdpa`'s mask function, except inside `boundaries_given` (no mask)."""
    from transformers.masking_utils import sdpa_mask

    return None if _NO_MASK.get() else sdpa_mask(*args, **kwargs)


def boundaries_from_positions(position_ids: Tensor) -> dict[str, Tensor | int]:
    """The `cu_seq_lens_q/k`, `max_length_q/k` keyword arguments of packed rows whose position
    ids restart at 0 at every example (the flattened batch's example starts, then its length)."""
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().view(-1)
    if flat.numel() and (starts.numel() == 0 or int(starts[0]) != 0):
        raise ValueError("packed rows must start with position 0")
    cu = torch.cat([starts, torch.tensor([flat.numel()], device=flat.device)]).to(torch.int32)
    longest = int(cu.diff().max()) if cu.numel() > 1 else 0
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


_last_segments: tuple = (None, None)  # (weakref to a cu_seq_lens tensor, its segments)


def _segments(cu: Tensor, rows: int, width: int) -> list[list[tuple[int, int]]]:
    """Per row, the (start, end) of its examples within the row, from the flattened boundaries.
    Every layer of a forward pass (and its recomputation) gets the same boundary tensor: its
    segments are read to the host once, not once per layer (a device synchronisation on a GPU)."""
    global _last_segments
    ref, cached = _last_segments
    if ref is not None and ref() is cu and cached[0] == (rows, width):
        return cached[1]
    out = _read_segments(cu, rows, width)
    _last_segments = (weakref.ref(cu), ((rows, width), out))
    return out


def _read_segments(cu: Tensor, rows: int, width: int) -> list[list[tuple[int, int]]]:
    bounds = cu.tolist()
    if bounds[0] != 0 or bounds[-1] != rows * width or any(b >= a for a, b in zip(bounds[1:], bounds)):
        raise ValueError(f"cu_seq_lens must rise from 0 to {rows * width} (the {rows} x {width} tokens), got {bounds}")
    out: list[list[tuple[int, int]]] = [[] for _ in range(rows)]
    for start, end in zip(bounds, bounds[1:]):
        row = start // width
        if (end - 1) // width != row:
            raise ValueError(f"a packed example spans rows {row} and {(end - 1) // width} (tokens {start}:{end})")
        out[row].append((start - row * width, end - row * width))
    return out


def sdpa_varlen_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                        dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                        cu_seq_lens_q: Tensor | None = None, cu_seq_lens_k: Tensor | None = None,
                        **kwargs) -> tuple[Tensor, None]:
    """transformers' attention function signature: query (B, Hq, L, D), key/value (B, Hkv, L, D)
    -> (B, L, Hq, D). With `cu_seq_lens_q` each example attends causally within itself (the mask
    is not used, as in `flash_attention_2`); without it, transformers' `sdpa`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if cu_seq_lens_k is not None and not torch.equal(cu_seq_lens_k, cu_seq_lens_q):
        raise ValueError("sdpa_varlen: queries and keys must have the same example boundaries")
    rows, _, width, _ = query.shape
    if key.shape[2] != width:
        raise ValueError(f"sdpa_varlen: {width} queries against {key.shape[2]} keys (packed rows take no KV cache)")
    gqa = query.shape[1] != key.shape[1]
    rows_out = []
    for r, examples in enumerate(_segments(cu_seq_lens_q, rows, width)):
        parts = [F.scaled_dot_product_attention(query[r:r + 1, :, s:e], key[r:r + 1, :, s:e], value[r:r + 1, :, s:e],
                                                dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa)
                 for s, e in examples]
        rows_out.append(torch.cat(parts, dim=2) if len(parts) > 1 else parts[0])
    out = torch.cat(rows_out, dim=0) if rows > 1 else rows_out[0]
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make `sdpa_varlen` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_forward)
    AttentionMaskInterface.register(SDPA_VARLEN, _mask)


def use_varlen_attention(model: nn.Module) -> bool:
    """Switch a Hugging Face model running `sdpa` to `sdpa_varlen` (logged once); True when the
    model runs `sdpa_varlen` afterwards. Other implementations are left as they are
    (`flash_attention_2/3` take the boundaries themselves; `eager` and `flex_attention` use the
    block mask)."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == SDPA_VARLEN:
        return True
    if impl != "sdpa" or not callable(getattr(model, "set_attn_implementation", None)):
        return False
    register()
    model.set_attn_implementation(SDPA_VARLEN)
    log.info("%s: attention sdpa -> %s (packed rows attend one example at a time)", type(model).__name__, SDPA_VARLEN)
    return True
