"""Pure tensor helpers shared by every method: torch and the standard library only (no Lightning,
no transformers, no model is run here; running a model for its log-probs is `lit_rlhf.models`)."""

from lit_rlhf.ops.linear_logprobs import linear_token_logps
from lit_rlhf.ops.logprobs import (
    DEFAULT_CHUNK_SIZE,
    apply_temperature,
    position_ids_from_mask,
    selective_log_softmax,
    token_logps_from_logits,
)
from lit_rlhf.ops.masked import masked_mean, masked_sum, masked_var, masked_whiten
from lit_rlhf.ops.mismatch import mismatch_partners, mismatched_sequences
from lit_rlhf.ops.rl import (
    gae,
    groups_of,
    kl_penalized_sequence_rewards,
    kl_penalty,
    last_true_index,
    place_at_last,
    place_rewards,
    truncate_after_eos,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "apply_temperature",
    "gae",
    "groups_of",
    "kl_penalized_sequence_rewards",
    "kl_penalty",
    "last_true_index",
    "linear_token_logps",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "mismatch_partners",
    "mismatched_sequences",
    "place_at_last",
    "place_rewards",
    "position_ids_from_mask",
    "selective_log_softmax",
    "token_logps_from_logits",
    "truncate_after_eos",
]
