"""Every model and tokenizer the methods need.

`loading`: tokenizers and causal LMs from a builtin name, a `.gguf` file, a directory or a hub
id (PAD != EOS, D3; dropout off, D7; frozen copies); `heads`: scalar-head models (reward, value,
DRO-V's V(x); D11, D12, D14); `reward_loading`: a trained reward model loaded back; `adapters`,
`scalar_adapters`, `merging`: LoRA adapters on one frozen base (the reference = adapters off),
scalar-head adapters, adapters merged for generation backends; `export`: a scalar-head model as a
plain sequence classifier; `logprobs`, `packed`, `shared_prompt`, `attention`: running a model
for its log-probs (dense or chunked, packed rows, a shared prompt, `sdpa_varlen`). The names of
`loading`, `heads`, `reward_loading` and `export` are importable from `lit_rlhf.models`.
"""

from __future__ import annotations

import importlib.util  # noqa: F401  (tests patch `lit_rlhf.models.importlib.util.find_spec`)

from lit_rlhf.models.export import REWARD_BIAS_KEY, final_norm_of, to_sequence_classifier
from lit_rlhf.models.heads import (ScalarHeadModel, backbone_of, hidden_size, init_scalar_head, load_scalar_model)
from lit_rlhf.models.loading import (
    BUILTIN_MODELS, PAD_TOKEN, SMOLLM2_135M_INSTRUCT, TINY_RANDOM_LLAMA, TINY_RANDOM_SMOLLM2, ModelNotFoundError,
    cache_dir, disable_dropout, ensure_pad_token, frozen_copy, load_causal_lm, load_reference_model, load_tokenizer
)
from lit_rlhf.models.reward_loading import load_reward_model

__all__ = [
    "BUILTIN_MODELS", "PAD_TOKEN", "REWARD_BIAS_KEY", "SMOLLM2_135M_INSTRUCT", "TINY_RANDOM_LLAMA",
    "TINY_RANDOM_SMOLLM2", "ModelNotFoundError", "ScalarHeadModel", "backbone_of", "cache_dir",
    "disable_dropout", "ensure_pad_token", "final_norm_of", "frozen_copy", "hidden_size",
    "init_scalar_head", "load_causal_lm", "load_reference_model", "load_reward_model",
    "load_scalar_model", "load_tokenizer", "to_sequence_classifier",
]
