"""What on-policy distillation runs a model for: a teacher's prompt with a privileged context, the
full next-token distributions over a sampled response (GKD's supervised form; or the hidden
states and output layer they come from, for the chunked form), and the check that a teacher
reads the student's tokens as the student does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.models import adapters
from lit_rlhf.models.output_layer import chunked_layers, forward_hidden, forward_logits, sharded_root
from lit_rlhf.ops import apply_temperature

# a probe whose token ids both tokenizers must agree on: words, digits, punctuation, accents, a
# newline and the chat markers of the ChatML templates
TOKENIZER_PROBE = "Hello, world! 12345 The TL;DR: a naïve café.\n<|im_start|>user\nWhy?<|im_end|>"


def with_context(prompt_ids: Tensor, prompt_mask: Tensor, context_ids: list[int], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Left-padded prompts (N, P) with `context_ids` (C tokens) inserted before each row's first
    real token -> (N, P + C) ids and bool mask, still left padded (D5)."""
    if not context_ids:
        return prompt_ids, prompt_mask
    n, width = prompt_ids.shape
    c = len(context_ids)
    ids = torch.full((n, width + c), pad_token_id, dtype=prompt_ids.dtype, device=prompt_ids.device)
    mask = torch.zeros((n, width + c), dtype=torch.bool, device=prompt_ids.device)
    ids[:, c:], mask[:, c:] = prompt_ids, prompt_mask.bool()
    start = width - prompt_mask.sum(dim=1)  # (N,) where the context goes, in the new columns
    cols = start[:, None] + torch.arange(c, device=prompt_ids.device)  # (N, C)
    context = torch.as_tensor(context_ids, dtype=prompt_ids.dtype, device=prompt_ids.device).expand(n, c)
    ids.scatter_(1, cols, context)
    mask.scatter_(1, cols, True)
    return ids, mask


def response_vocab_logps(model: nn.Module | Any, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                         response_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """Next-token log-probabilities (N, R, V) at every response position: row t is the distribution
    that predicted response token t, `log_softmax(logits / temperature)` (`apply_temperature`).
    Only the R positions' logits are computed (`logits_to_keep`); differentiable unless called
    under `torch.no_grad()`; an `AdapterView` runs its base with its adapter (or none)."""
    width = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention = torch.cat([prompt_mask.bool(), response_mask.bool()], dim=1)
    with adapters.activated(model) as module:
        logits = forward_logits(module, input_ids, attention, logits_to_keep=width + 1)[:, :-1]  # (N, R, V)
    return torch.log_softmax(apply_temperature(logits.float(), temperature), dim=-1)


def response_hidden(model: nn.Module | Any, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                    response_mask: Tensor) -> tuple[Tensor, nn.Linear] | None:
    """(the last hidden states (N, R, H) that predict each response token, the output layer) for
    `chunked_gkd_loss`, or None where the chunked path does not reproduce the model's logits
    (`chunked_layers`) or the layer's weight is partitioned across ranks (DeepSpeed ZeRO-3: it
    exists whole only inside the layer's own forward; FSDP2: only inside its root's forward);
    differentiable unless called under `torch.no_grad()`; an `AdapterView` runs its base with its adapter (or none)."""
    width = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention = torch.cat([prompt_mask.bool(), response_mask.bool()], dim=1)
    with adapters.activated(model) as module:
        layers = chunked_layers(module, input_ids)
        if layers is None or hasattr(layers[1].weight, "ds_id") or sharded_root(module) is not None:
            return None
        decoder, head = layers
        return forward_hidden(decoder, input_ids, attention)[:, -(width + 1):-1], head


def tokenizer_differences(student: Any, teacher: Any, probe: str = TOKENIZER_PROBE) -> list[str]:
    """How the teacher's tokenizer differs from the student's (empty when they are the same):
    the vocabulary (token -> id), the EOS id, the ids of `probe`."""
    found = []
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        differ = sum(1 for token, i in s_vocab.items() if t_vocab.get(token) != i) + len(t_vocab.keys() - s_vocab.keys())
        found.append(f"vocabularies of {len(s_vocab)} and {len(t_vocab)} tokens, {differ} tokens with other ids")
    if student.eos_token_id != teacher.eos_token_id:
        found.append(f"EOS ids {student.eos_token_id} and {teacher.eos_token_id}")
    s_ids = student(probe, add_special_tokens=False)["input_ids"]
    t_ids = teacher(probe, add_special_tokens=False)["input_ids"]
    if s_ids != t_ids:
        found.append(f"the probe {probe!r} encodes to {s_ids[:8]}... and {t_ids[:8]}...")
    return found
