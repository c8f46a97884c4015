"""Typed batches and rollouts.

Every batch a DataModule yields and every rollout `generation.py` returns is one of these
immutable NamedTuples; batches move between devices with `.to(device)` (tensors moved, `meta`
kept), which is what Lightning calls.

Conventions (DESIGN.md section 1):
- masks are boolean, True = keep;
- `B` is the batch size, `T` the padded sequence length, `P` the padded prompt length and
  `R` the (fixed) response length of a rollout;
- per-token log-probs are aligned with the token they score: `per_token_logps[:, t]` is
  `log p(input_ids[:, t] | input_ids[:, :t])`, and 0 where the mask is False;
- `meta` carries the non-tensor columns of a batch (prompt text, reference completion, row
  ids, grouping columns such as the TL;DR `batch` or `confidence`) as lists of length B.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor


def _move(batch: Any, *args: Any, **kwargs: Any) -> Any:
    """`batch.to(device)`: the same batch with every tensor field moved (`meta` as it is).

    Lightning moves an object with a `to` method by calling it, instead of walking every field
    and every element of `meta`'s lists (a fixed cost per training step)."""
    return batch._replace(**{k: v.to(*args, **kwargs) for k, v in batch._asdict().items() if isinstance(v, Tensor)})


class SFTBatch(NamedTuple):
    """Right-padded prompt+completion sequences (D5)."""

    input_ids: Tensor  # (B, T) long
    attention_mask: Tensor  # (B, T) bool, True on real tokens
    loss_mask: Tensor  # (B, T) bool, True on completion tokens (EOS included), False on prompt/pad
    meta: dict[str, list[Any]] = {}

    to = _move


class PreferenceBatch(NamedTuple):
    """Pairs collated for one forward pass (D5, right padding).

    Rows `[:B]` are the chosen sequences and rows `[B:]` the rejected ones, so
    `input_ids.shape == (2B, T)`; `chosen_*` / `rejected_*` views are given by `split_pair`.
    """

    input_ids: Tensor  # (2B, T) long, chosen rows first
    attention_mask: Tensor  # (2B, T) bool
    loss_mask: Tensor  # (2B, T) bool, True on completion tokens
    prompt_lengths: Tensor  # (2B,) long, number of prompt tokens of each row
    margin: Tensor | None = None  # (B,) float, a per-pair margin from the data when asked for
    meta: dict[str, list[Any]] = {}

    to = _move

    @property
    def num_pairs(self) -> int:
        return self.input_ids.shape[0] // 2


class SingleBatch(NamedTuple):
    """Single trajectories (prompt, completion, scalar reward / binary label), right padded."""

    input_ids: Tensor  # (B, T) long
    attention_mask: Tensor  # (B, T) bool
    loss_mask: Tensor  # (B, T) bool, True on completion tokens
    prompt_lengths: Tensor  # (B,) long
    rewards: Tensor | None = None  # (B,) float, normalised reward when the data has one
    labels: Tensor | None = None  # (B,) bool, True = desirable, when the data has one
    meta: dict[str, list[Any]] = {}

    to = _move


class PromptBatch(NamedTuple):
    """Left-padded prompts for generation (D5)."""

    input_ids: Tensor  # (B, P) long, left padded
    attention_mask: Tensor  # (B, P) bool
    meta: dict[str, list[Any]] = {}  # at least "prompt" (text); "reference" when the data has one

    to = _move


class Rollout(NamedTuple):
    """Everything one round of generation produced. Immutable: shaping returns a new one.

    `response_ids` are cut after the first EOS and PAD-filled (D23); `response_mask` is True up
    to and including the first EOS (or on all R tokens when there is none).
    """

    prompt_ids: Tensor  # (B, P) left padded
    prompt_mask: Tensor  # (B, P) bool
    response_ids: Tensor  # (B, R)
    response_mask: Tensor  # (B, R) bool
    has_eos: Tensor  # (B,) bool
    # (B, R) policy log-probs at sampling time (temperature applied), 0 on pad. None until the
    # update fills them when it computes them itself (on-policy GRPO: one pass, one minibatch)
    logps: Tensor | None
    ref_logps: Tensor | None = None  # (B, R) reference log-probs, None when no reference is used
    values: Tensor | None = None  # (B, R) value estimates (PPO)
    scores: Tensor | None = None  # (B,) scalar reward of each response, after shaping hooks
    meta: dict[str, list[Any]] = {}
    sampler_logps: Tensor | None = None  # (B, R) the sampling engine's log-probs (vLLM backend), else None

    @property
    def input_ids(self) -> Tensor:  # (B, P+R)
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:  # (B, P+R)
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def with_scores(self, scores: Tensor) -> "Rollout":
        return self._replace(scores=scores)


def split_pair(t: Tensor) -> tuple[Tensor, Tensor]:
    """Split a (2B, ...) tensor of a `PreferenceBatch` into its (chosen, rejected) halves."""
    if t.shape[0] % 2:
        raise ValueError(f"a paired tensor needs an even first dimension, got shape {tuple(t.shape)}")
    half = t.shape[0] // 2
    return t[:half], t[half:]
