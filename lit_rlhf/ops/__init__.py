"""Pure tensor helpers shared by every method (no Lightning, no transformers)."""

from lit_rlhf.ops.linear_logprobs import linear_token_logps
from lit_rlhf.ops.logprobs import (
    DEFAULT_CHUNK_SIZE,
    chunked_layers,
    forward_hidden,
    forward_logits,
    per_token_logps,
    position_ids_from_mask,
    response_logps,
    selective_log_softmax,
    token_logps_from_logits,
)
from lit_rlhf.ops.masked import masked_mean, masked_sum, masked_var, masked_whiten
from lit_rlhf.ops.rl import gae, kl_penalty, last_true_index, place_at_last, truncate_after_eos

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "chunked_layers",
    "forward_hidden",
    "forward_logits",
    "gae",
    "kl_penalty",
    "last_true_index",
    "linear_token_logps",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "per_token_logps",
    "place_at_last",
    "position_ids_from_mask",
    "response_logps",
    "selective_log_softmax",
    "token_logps_from_logits",
    "truncate_after_eos",
]
