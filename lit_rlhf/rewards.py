"""Reward sources for online methods (PPO, GRPO): reward models and Python callables.

A reward source is anything that turns sampled completions into one scalar each:

- a **reward model**: a `ScalarHeadModel` read at the EOS token of prompt+response, i.e. the
  last real token of the row (D12; D14 makes the left-padded prompt harmless). It is loaded
  from a `RewardModule` checkpoint or an exported `AutoModelForSequenceClassification`
  directory by `load_reward_model` (see `lit_rlhf.models`);
- a **reward function**: any callable `(prompts, completions, **batch_columns) -> rewards`,
  where `prompts` and `completions` are lists of N strings (completions without EOS and
  padding), `batch_columns` are the PromptBatch's `meta` columns repeated to N rows (for
  instance `reference` for a verifiable answer), and `rewards` is a sequence or tensor of N
  floats. In a YAML config a function is a dotted path (`my_pkg.rewards.exact_match`) and a
  callable class is `{class_path: my_pkg.rewards.Fn, init_args: {...}}`.

`combine_rewards` weighs several sources (`reward_weights`, default 1 each) into the score of
each response. Two small example functions live here (`CharacterFractionReward`,
`ReferenceMatchReward`); they are also what the tests learn from.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from lit_rlhf import models
from lit_rlhf.ops import last_true_index

RewardFn = Callable[..., Any]


def load_reward_model(name: str, tokenizer=None, dtype: str = "float32") -> models.ScalarHeadModel:
    """A scalar model for rewards or values (`lit_rlhf.models.load_reward_model`): a
    `RewardModule` checkpoint, an exported directory, or a causal LM with a fresh D11 head."""
    return models.load_reward_model(name, tokenizer, dtype=dtype)


@torch.no_grad()
def reward_model_scores(
    reward_model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    micro_batch_size: int | None = None,
) -> Tensor:
    """Scores (N,) of left-padded prompt + D23-cut response rows (N, P+R), read at the last
    real token of each row: the EOS of a response that has one, its last token otherwise (D12)."""
    size = micro_batch_size or input_ids.shape[0]
    index = last_true_index(attention_mask.bool())  # (N,)
    chunks = []
    for start in range(0, input_ids.shape[0], size):
        sl = slice(start, start + size)
        chunks.append(reward_model.score(input_ids[sl], attention_mask[sl], index[sl]).float())
    return torch.cat(chunks)


def function_name(fn: RewardFn) -> str:
    """A short, metric-friendly name of a reward function or callable object."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return name.strip("_<>") or "reward_fn"


def call_reward_fn(fn: RewardFn, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> Tensor:
    """Call `fn(prompts, completions, **columns)` and check it returned N finite floats -> (N,)."""
    name = function_name(fn)
    columns = {k: v for k, v in columns.items() if k not in ("prompts", "completions")}
    out = fn(prompts, completions, **columns)
    try:
        rewards = torch.as_tensor(out if isinstance(out, Tensor) else list(out), dtype=torch.float32).detach().cpu()
    except (TypeError, ValueError) as err:
        raise TypeError(f"reward function {name!r} must return N floats, got {type(out).__name__}: {err}") from err
    if rewards.shape != (len(completions),):
        raise ValueError(f"reward function {name!r} returned shape {tuple(rewards.shape)}, expected ({len(completions)},)")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError(f"reward function {name!r} returned non-finite rewards: {rewards.tolist()}")
    return rewards


def combine_rewards(per_source: dict[str, Tensor], weights: Sequence[float] | None) -> Tensor:
    """Weighted sum of the sources' (N,) rewards, in the order of `per_source` -> (N,)."""
    if not per_source:
        raise ValueError("no reward source: set reward_model and/or reward_fns")
    values = list(per_source.values())
    weights = [1.0] * len(values) if weights is None else list(weights)
    if len(weights) != len(values):
        raise ValueError(
            f"reward_weights has {len(weights)} entries but there are {len(values)} reward sources "
            f"({', '.join(per_source)}): give one weight per source, reward model first"
        )
    total = torch.zeros_like(values[0])
    for w, v in zip(weights, values):
        total = total + float(w) * v.to(total.device, total.dtype)
    return total


# ----------------------------------------------------------------------------------------------
# example reward functions (verifiable rewards)
# ----------------------------------------------------------------------------------------------


class CharacterFractionReward:
    """Reward = fraction of the completion's characters that are in `chars` (0 for an empty one).

    Args:
        chars: the characters that earn reward.
        scale: multiplies the fraction.
    """

    def __init__(self, chars: str = "abcdefghijklmnopqrstuvwxyz", scale: float = 1.0) -> None:
        if not chars:
            raise ValueError("chars must not be empty")
        self.chars = set(chars)
        self.scale = scale

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [self.scale * (sum(c in self.chars for c in text) / len(text) if text else 0.0) for text in completions]


class ReferenceMatchReward:
    """Verifiable reward: 1 when the completion (stripped) equals the `reference` column, else 0.

    Args:
        column: the batch column holding the expected answer.
        strip: compare stripped texts.
    """

    def __init__(self, column: str = "reference", strip: bool = True) -> None:
        self.column = column
        self.strip = strip

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        if self.column not in columns:
            raise KeyError(f"ReferenceMatchReward needs the batch column {self.column!r}; the batch has {sorted(columns)}")
        norm = (lambda s: (s or "").strip()) if self.strip else (lambda s: s or "")
        return [float(norm(c) == norm(r)) for c, r in zip(completions, columns[self.column])]
