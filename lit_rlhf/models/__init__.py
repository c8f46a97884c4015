"""Every model and tokenizer the methods need:

- `loading`: tokenizers and causal LMs from a builtin name, a `.gguf` file, a local directory or
  a hub id; PAD != EOS (D3), dropout off (D7), frozen copies;
- `heads`: scalar-head models (reward models, PPO value models, DRO-V's V(x); D11, D12, D14);
- `reward_loading`: a trained reward model loaded back (checkpoint, export, LoRA adapter);
- `adapters`: LoRA (`peft`): named adapters on one frozen base (policy, value, reward), the
  reference policy as that base with the adapters disabled; `scalar_adapters`: scalar-head
  networks as adapters; `merging`: adapters merged for generation backends;
- `export`: a scalar-head model as a plain `transformers` sequence classifier;
- running a model for its log-probs: `logprobs` (dense or chunked output layer), `packed`
  (packed rows), `shared_prompt` (a prompt computed once for its completions), and
  `attention` (`sdpa_varlen`, attention one packed example at a time).

The names of `loading`, `heads`, `reward_loading` and `export` are importable from
`lit_rlhf.models` itself.
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
