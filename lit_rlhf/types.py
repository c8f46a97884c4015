"""Typed batches and rollouts.

Every batch a DataModule yields and every rollout an online module samples is one of these
immutable NamedTuples; batches move between devices with `.to(device)` (tensors moved, `meta`
kept), which is what Lightning calls.

Conventions (`docs/ARCHITECTURE.md` section 3):
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


class PackedSFTBatch(NamedTuple):
    """SFT examples packed end to end into rows, without padding between them (padding-free).

    Row r holds whole examples one after the other; `position_ids` restart at 0 at the first
    token of every example, and attention never crosses from one example into another: the
    model gets `position_ids` and no attention mask, and detects the packed examples from the
    restarts (Hugging Face `masking_utils.find_packed_sequence_indices`: a block-diagonal causal
    mask for the sdpa/eager/flex kernels, per-example lengths for flash-attention). PAD fills a
    row after its last example only; that tail is numbered 0, 1, ... as one more segment, which
    no example attends to (it comes after them) and nothing scores. A token at position 0 is
    never scored (it has no context), as column 0 of the padded layout. Built by
    `lit_rlhf.data.packing.PackedSFTCollator`; `unpack` gives back the
    right-padded `SFTBatch` of the same examples. Loss sums over `loss_mask` equal the padded
    batch's, so a token-mean loss is unchanged.
    """

    input_ids: Tensor  # (R, L) long, R <= B rows, examples end to end, PAD after the last one of a row
    position_ids: Tensor  # (R, L) long, 0 at every example's first token (and at the PAD tail's)
    attention_mask: Tensor  # (R, L) bool, True on example tokens; not given to the model (see above)
    loss_mask: Tensor  # (R, L) bool, True on completion tokens (EOS included)
    example_rows: Tensor  # (B,) long, row of each example (examples in the collator's input order)
    example_starts: Tensor  # (B,) long, column of each example's first token in its row
    example_lengths: Tensor  # (B,) long, tokens of each example
    meta: dict[str, list[Any]] = {}  # lists of length B (examples, not rows)

    to = _move

    @property
    def num_examples(self) -> int:
        return self.example_lengths.shape[0]


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

    @property
    def sharing(self) -> "PromptSharing":
        """Pair i (rows i and B + i) has one prompt, in columns [:prompt_lengths]."""
        groups = torch.arange(self.input_ids.shape[0], device=self.input_ids.device) % max(self.num_pairs, 1)
        return PromptSharing(self.prompt_lengths, groups)


class SingleBatch(NamedTuple):
    """Single trajectories (prompt, completion, scalar reward / binary label), right padded."""

    input_ids: Tensor  # (B, T) long
    attention_mask: Tensor  # (B, T) bool
    loss_mask: Tensor  # (B, T) bool, True on completion tokens
    prompt_lengths: Tensor  # (B,) long
    rewards: Tensor | None = None  # (B,) float, normalised reward when the data has one
    labels: Tensor | None = None  # (B,) bool, True = desirable, when the data has one
    meta: dict[str, list[Any]] = {}
    prompt_groups: Tensor | None = None  # (B,) long, equal ids = the same prompt tokens (the collator's)

    to = _move

    @property
    def sharing(self) -> "PromptSharing | None":
        """Rows with the same prompt (`prompt_groups`), for the shared-prompt forward; None when
        the batch does not say."""
        if self.prompt_groups is None:
            return None
        return PromptSharing(self.prompt_lengths, self.prompt_groups)


class ListBatch(NamedTuple):
    """K completions of each of B prompts as B ranked lists, right padded (D5): Plackett-Luce,
    listwise DPO, a reward model trained on rankings.

    Rows `[b*K:(b+1)*K]` are list b's completions in the data's order and `ranking[b]` orders
    them best first. A list is its own prompt group, whatever its prompt text (`sharing`): two
    lists with the same instruction stay two lists.
    """

    input_ids: Tensor  # (B*K, T) long, list-major
    attention_mask: Tensor  # (B*K, T) bool
    loss_mask: Tensor  # (B*K, T) bool, True on completion tokens
    prompt_lengths: Tensor  # (B*K,) long
    scores: Tensor  # (B, K) float, the data's score of each completion
    ranking: Tensor  # (B, K) long, completion indices best first
    meta: dict[str, list[Any]] = {}  # lists of length B (one entry per list)

    to = _move

    @property
    def num_lists(self) -> int:
        return self.scores.shape[0]

    @property
    def sharing(self) -> "PromptSharing":
        """The K rows of list b form group b (by position, never by prompt tokens)."""
        rows = torch.arange(self.input_ids.shape[0], device=self.input_ids.device)
        return PromptSharing(self.prompt_lengths, rows // max(self.scores.shape[1], 1))


class PromptBatch(NamedTuple):
    """Left-padded prompts for generation (D5)."""

    input_ids: Tensor  # (B, P) long, left padded
    attention_mask: Tensor  # (B, P) bool
    meta: dict[str, list[Any]] = {}  # at least "prompt" (text); "reference" when the data has one

    to = _move


class Rollout(NamedTuple):
    """Everything one round of generation produced. Immutable: shaping returns a new one.

    `response_ids` are cut after the first EOS and PAD-filled (D23). Two masks, one for each job:
    `loss_mask` (a property) marks the tokens a method trains on, the policy's own sampled tokens;
    `response_attention_mask` is the response's attention mask, every real token, the
    environment's observations included in a multi-turn rollout (`lit_rlhf.online.environment`,
    whose `action_mask` marks the policy's tokens). Losses, KLs and advantages use `loss_mask`;
    `response_attention_mask` only feeds the model's attention. For one turn the two are equal:
    True up to and including the first EOS (or on all R tokens when there is none).

    `extras` is the method's own per-row data, carried from the rollout to the update
    (`OnlineModule.rollout_extras` adds it): name -> tensor whose leading dimension is the
    rollout's N rows (ReMax: the reward of each row's greedy response). Extras follow the rows
    wherever the rollout's tensors go: `rows` slices them with the rows (minibatches, dynamic
    sampling), `to` moves them, `cat_rollouts` concatenates them. They are plain tensors and a
    rollout lives within one training step, so nothing of it enters a checkpoint: what makes a
    resumed run draw the same extras is the restored random state they were drawn from.
    """

    prompt_ids: Tensor  # (B, P) left padded
    prompt_mask: Tensor  # (B, P) bool
    response_ids: Tensor  # (B, R)
    response_attention_mask: Tensor  # (B, R) bool: attention only; train on `loss_mask`
    has_eos: Tensor  # (B,) bool
    # (B, R) policy log-probs at sampling time (temperature applied), 0 on pad. None when the
    # rollout did not compute them: an on-policy update computes its own (GRPO with one pass over
    # one minibatch fills them in), and a method that never needs them (rejection sampling, whose
    # update is an NLL on the kept rows) leaves them None; every consumer checks for None
    logps: Tensor | None
    ref_logps: Tensor | None = None  # (B, R) reference log-probs, None when no reference is used
    values: Tensor | None = None  # (B, R) value estimates (PPO)
    scores: Tensor | None = None  # (B,) scalar reward of each response, after shaping hooks
    meta: dict[str, list[Any]] = {}
    sampler_logps: Tensor | None = None  # (B, R) the sampling engine's log-probs (vLLM backend), else None
    extras: dict[str, Tensor] = {}  # the method's per-row data: name -> (B, ...) tensor
    # multi-turn episodes (`lit_rlhf.envs`): the response is everything after the first prompt,
    # the policy's turns and the environment's observations; `response_attention_mask` is then the
    # attention mask of the response (every real token) and `action_mask` (B, R) bool marks the
    # policy's own tokens, the ones every loss, KL and advantage is on (`loss_mask`); None = every
    # response token is the policy's (one turn). `turn_rewards` (B, R): each turn's environment
    # reward on its last policy token (PPO places rewards per turn), None for one turn
    action_mask: Tensor | None = None
    turn_rewards: Tensor | None = None

    @property
    def loss_mask(self) -> Tensor:  # (B, R) bool
        """The tokens the policy is trained on: its own sampled tokens (the response's real tokens,
        and of those only `action_mask`'s when the rollout has environment tokens)."""
        mask = self.response_attention_mask
        return mask if self.action_mask is None else mask & self.action_mask

    def on_policy_tokens(self, per_token: Tensor | None) -> Tensor | None:
        """Per-token values (N, R) with 0 off the policy's tokens (`loss_mask`): a multi-turn
        rollout scores its environment tokens as context only."""
        if per_token is None or self.action_mask is None:
            return per_token
        return per_token.masked_fill(~self.loss_mask, 0.0)

    @property
    def input_ids(self) -> Tensor:  # (B, P+R)
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:  # (B, P+R)
        return torch.cat([self.prompt_mask, self.response_attention_mask], dim=1)

    @property
    def num_rows(self) -> int:
        return int(self.response_ids.shape[0])

    def with_scores(self, scores: Tensor) -> "Rollout":
        return self._replace(scores=scores)

    def with_extras(self, **extras: Tensor) -> "Rollout":
        """The rollout with `extras` added to (or replacing entries of) its per-row extras; each
        must be a tensor whose leading dimension is the rollout's number of rows."""
        n = self.num_rows
        for name, value in extras.items():
            if not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != n:
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"rollout extra {name!r} must be a tensor with one row per response ({n}), got {shape}")
        return self._replace(extras={**self.extras, **extras})

    def rows(self, index: Tensor) -> "Rollout":
        """The rollout restricted to the rows `index` (a 1-d index or boolean tensor): every
        per-row tensor, extra and `meta` list picked."""
        positions = torch.arange(self.num_rows, device=self.response_ids.device)[index].tolist()
        fields = {k: (v[index] if isinstance(v, Tensor) else v) for k, v in self._asdict().items()
                  if k not in ("meta", "extras")}
        return Rollout(**fields, meta={k: [v[i] for i in positions] for k, v in self.meta.items()},
                       extras={k: v[index] for k, v in self.extras.items()})

    def to(self, *args: Any, **kwargs: Any) -> "Rollout":
        """The same rollout with every tensor, extras included, moved (`meta` as it is)."""
        moved = _move(self, *args, **kwargs)
        return moved._replace(extras={k: v.to(*args, **kwargs) for k, v in self.extras.items()})


def split_pair(t: Tensor) -> tuple[Tensor, Tensor]:
    """Split a (2B, ...) tensor of a `PreferenceBatch` into its (chosen, rejected) halves."""
    if t.shape[0] % 2:
        raise ValueError(f"a paired tensor needs an even first dimension, got shape {tuple(t.shape)}")
    half = t.shape[0] // 2
    return t[:half], t[half:]


class PromptSharing(NamedTuple):
    """Which rows of a prompt+completion batch share their prompt (`lit_rlhf.ops.shared_prompt`).

    Row n's prompt is its real tokens before column `prompt_end[n]`, its completion the real
    tokens from there on; rows with the same `groups` id have the same prompt tokens (a
    `PreferenceBatch`'s pair i: rows i and B + i; a GRPO rollout: the G rows of one prompt).
    """

    prompt_end: Tensor  # (N,) long, the column where each row's completion starts
    groups: Tensor  # (N,) long, rows with equal ids share their prompt


class SharedPromptLayout(NamedTuple):
    """Rows that share a prompt packed into one sequence each: `[prompt, completion_1, ...,
    completion_k]`, right padded to `L` (built by `lit_rlhf.ops.shared_prompt.build_layout`).

    Completion j attends to the prompt and causally to itself only (`attention_bias`), and its
    positions continue from the prompt's length, so every token sees exactly the context it has
    in its own row. `token_index` maps each real token of the N source rows (B x T) to its place
    in the packed rows: the prompt tokens of a group's rows all map to the one shared copy, so the
    first token of every completion is predicted from the shared prompt's last position.
    """

    input_ids: Tensor  # (M, L) long, one packed row per group, right padded
    position_ids: Tensor  # (M, L) long: prompt 0..p-1, each completion continuing from p; 0 on padding
    segment_ids: Tensor  # (M, L) long: 0 on the prompt, j >= 1 on the j-th completion, -1 on padding
    token_index: Tensor  # (N, T) long: flat index into (M * L) of each real source token, -1 on padding

    to = _move

    def attention_bias(self, dtype: torch.dtype) -> Tensor:
        """(M, 1, L, L) additive attention mask in `dtype`: 0 where query i may attend to key j
        (j <= i, and j on the prompt or on i's own segment), the dtype's minimum elsewhere. Every
        position sees itself, so no row of the softmax is empty; no real token sees padding."""
        seg = self.segment_ids
        length = seg.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
        query, key = seg[:, :, None], seg[:, None, :]  # (M, L, 1), (M, 1, L)
        allowed = causal & ((key == 0) | (key == query))
        bias = torch.zeros(allowed.shape, dtype=dtype, device=seg.device)
        return bias.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


# ----------------------------------------------------------------------------------------------
# helpers on batches
# ----------------------------------------------------------------------------------------------


def unpack(batch: PackedSFTBatch, pad_token_id: int) -> SFTBatch:
    """The right-padded `SFTBatch` of the examples of a packed batch (in their input order)."""
    lengths = batch.example_lengths.tolist()
    rows, starts = batch.example_rows.tolist(), batch.example_starts.tolist()
    width = max(lengths, default=0)
    device = batch.input_ids.device
    ids = torch.full((len(lengths), width), pad_token_id, dtype=torch.long, device=device)
    attention = torch.zeros((len(lengths), width), dtype=torch.bool, device=device)
    loss = torch.zeros_like(attention)
    for i, (r, s, n) in enumerate(zip(rows, starts, lengths)):
        ids[i, :n] = batch.input_ids[r, s: s + n]
        attention[i, :n] = True
        loss[i, :n] = batch.loss_mask[r, s: s + n]
    return SFTBatch(ids, attention, loss, batch.meta)


def padding_fraction(batch: Any) -> float | None:
    """Share of the token slots of `batch` that are padding: 1 - real tokens / slots, from its
    `attention_mask` (None for a batch without one)."""
    mask = getattr(batch, "attention_mask", None)
    if not isinstance(mask, Tensor) or mask.numel() == 0:
        return None
    return 1.0 - float(mask.sum()) / mask.numel()
