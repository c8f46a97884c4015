"""A rollout of fixed completions instead of samples: the off-policy batches of GKD's mix
(Agarwal et al. 2024, Sec. 3.2: with probability 1 - lambda a batch's outputs come from a fixed
dataset instead of the student).

The completion of each prompt is its `reference` column (the prompt DataModules carry the SFT
answer or the chosen response there), tokenised without special tokens, then EOS, cut to
`max_new_tokens` (a cut completion has no EOS, as a sample that ran out of tokens) and laid out
like a sampled rollout: `repeats` copies per prompt, contiguous, right-padded with PAD.
"""

from __future__ import annotations

from typing import Any

import torch

from lit_rlhf.generation.config import finish_responses
from lit_rlhf.online.sources import repeated_prompts
from lit_rlhf.types import PromptBatch, Rollout


def reference_rollout(batch: PromptBatch, tokenizer: Any, repeats: int, max_new_tokens: int) -> Rollout:
    """The batch's reference completions as a rollout (no log-probs, no scores)."""
    references = batch.meta.get("reference")
    if references is None or any(not isinstance(text, str) or not text for text in references):
        rows = [] if references is None else [i for i, text in enumerate(references) if not isinstance(text, str) or not text]
        raise ValueError("an off-policy batch needs each prompt's completion in the batch's `reference` column, "
                         + ("which this DataModule does not give" if references is None
                            else f"empty or missing in rows {rows} of this batch"))
    prompt_ids, prompt_mask, meta = repeated_prompts(batch, repeats)
    tokens = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for text in references]
    width = min(max(len(t) for t in tokens), max_new_tokens)
    ids = torch.full((len(tokens), width), tokenizer.pad_token_id, dtype=torch.long)
    for row, t in enumerate(tokens):
        ids[row, :min(len(t), width)] = torch.tensor(t[:width])
    ids = ids.repeat_interleave(repeats, dim=0).to(prompt_ids.device)
    response_ids, response_mask, has_eos = finish_responses(ids, max_new_tokens, tokenizer.eos_token_id,
                                                            tokenizer.pad_token_id)
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, has_eos, None, meta=meta)
