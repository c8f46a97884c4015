"""Reward sources for online methods (PPO, GRPO): reward models and reward functions, how a
function is called and checked, and how several sources are combined into one score.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Literal, Sequence

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
    groups: Tensor | None = None,
    prompt_width: int = 0,
) -> Tensor:
    """Scores (N,) of left-padded prompt + D23-cut response rows (N, P+R), read at the last
    real token of each row: the EOS of a response that has one, its last token otherwise (D12).

    `groups` (N,): rows with equal ids have the same prompt (columns [:prompt_width]); each
    micro-batch then computes each of its prompts once (`lit_rlhf.models.shared_prompt`), same scores."""
    from lit_rlhf.models.shared_prompt import grouped_scalar_scores
    from lit_rlhf.types import PromptSharing

    size = micro_batch_size or input_ids.shape[0]
    index = last_true_index(attention_mask.bool())  # (N,)
    chunks = []
    for start in range(0, input_ids.shape[0], size):
        sl = slice(start, start + size)
        if groups is not None and hasattr(reward_model, "backbone"):
            ends = torch.full((groups[sl].shape[0],), prompt_width, dtype=torch.long, device=groups.device)
            sharing = PromptSharing(ends, groups[sl])
            chunks.append(grouped_scalar_scores(reward_model, input_ids[sl], attention_mask[sl], sharing).float())
        else:
            chunks.append(reward_model.score(input_ids[sl], attention_mask[sl], index[sl]).float())
    return torch.cat(chunks)


def check_reward_sources(reward_model: str | None, reward_fns: list | None, reward_weights: list[float] | None,
                        normalization: str, with_environment: bool, required: bool = True) -> list:
    """The reward functions, once an online method's sources add up: one weight each (the reward
    model first, then `reward_fns` in order, then an environment's return), and at least one
    source unless the method trains without (`required` False: every score is then 0)."""
    if normalization not in ("none", "group", "batch"):
        raise ValueError(f"reward_normalization must be 'none', 'group' or 'batch', got {normalization!r}")
    fns = list(reward_fns or [])
    if any(not callable(fn) for fn in fns):
        raise TypeError(f"reward_fns entries must be callables, got {fns!r}")
    n_sources = int(reward_model is not None) + len(fns) + int(with_environment)
    if n_sources == 0 and required:
        raise ValueError("no reward source: set reward_model and/or reward_fns (or run an environment)")
    if reward_weights is not None and len(reward_weights) != n_sources:
        raise ValueError(f"reward_weights has {len(reward_weights)} entries for {n_sources} reward sources "
                         "(the reward model first, then reward_fns in order, then the environment)")
    return fns


def prompt_texts(rollout: Any, tokenizer: Any, k: int | None = None) -> list[str]:
    """The prompts of a rollout's first `k` rows as text: the `prompt` meta column, else decoded."""
    found = rollout.meta.get("prompt")
    if found is not None:
        return list(found[:k])
    return tokenizer.batch_decode([ids[m].tolist() for ids, m in zip(rollout.prompt_ids[:k], rollout.prompt_mask[:k])])


def function_name(fn: RewardFn, taken: Collection[str] = ()) -> str:
    """A short, metric-friendly name of a reward function or callable object, "_" added while `taken`."""
    name = (getattr(fn, "__name__", None) or type(fn).__name__).strip("_<>") or "reward_fn"
    while name in taken:  # another source's name
        name += "_"
    return name


RewardNormalization = Literal["none", "group", "batch"]


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something unusable; names the function and the row."""


def _describe_row(i: int, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> str:
    index = columns.get("index")
    where = f"row {i} of the rollout"
    if index is not None and i < len(index):
        where += f" (dataset row {index[i]})"
    return f"{where}: prompt {prompts[i][-120:]!r}, completion {completions[i][:200]!r}"


def _raised(fn: RewardFn, err: BaseException, prompts, completions, columns) -> RewardFunctionError:
    """The error of a reward function that raised on a batch: it names the function and the first
    row it raises on (found by calling it again one row at a time), with the dataset row index,
    prompt and completion."""
    name = function_name(fn)
    for i in range(len(completions)):
        try:
            fn([prompts[i]], [completions[i]], **{k: [v[i]] for k, v in columns.items()})
        except Exception as row_err:  # noqa: BLE001 - any error is the one to report
            return RewardFunctionError(f"reward function {name!r} raised {type(row_err).__name__}: {row_err} on "
                                       + _describe_row(i, prompts, completions, columns))
    return RewardFunctionError(f"reward function {name!r} raised {type(err).__name__}: {err} on a batch of "
                               f"{len(completions)} rows (no single row raises on its own)")


def call_reward_fn(fn: RewardFn, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> Tensor:
    """Call `fn(prompts, completions, **columns)` and check it returned N finite floats -> (N,); a
    raise (`RewardFunctionError`, `_raised`) or a non-finite reward names the function and the row."""
    name = function_name(fn)
    columns = {k: v for k, v in columns.items() if k not in ("prompts", "completions")}  # fn's positional names
    try:
        out = fn(prompts, completions, **columns)
    except Exception as err:
        raise _raised(fn, err, prompts, completions, columns) from err
    try:
        rewards = torch.as_tensor(out if isinstance(out, Tensor) else list(out), dtype=torch.float32).detach().cpu()
    except (TypeError, ValueError) as err:
        raise TypeError(f"reward function {name!r} must return N floats, got {type(out).__name__}: {err}") from err
    if rewards.shape != (len(completions),):
        raise ValueError(f"reward function {name!r} returned shape {tuple(rewards.shape)}, expected ({len(completions)},)")
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"reward function {name!r} returned non-finite rewards at {len(bad)} row(s) {bad[:8]}; first: "
                         f"{rewards[bad[0]].item()} on " + _describe_row(bad[0], prompts, completions, columns))
    return rewards


def normalize_reward(rewards: Tensor, how: RewardNormalization, group_size: int = 1, eps: float = 1e-4) -> Tensor:
    """One source's rewards (N,) z-scored before the sources are combined -> (N,).

    - "group": within each group of `group_size` contiguous rows (a prompt's G completions),
      (r - mean) / (std + eps), and exactly 0 for a group whose rewards are all equal: the
      per-reward decoupled normalisation of GDPO (Liu et al. 2026, "Group reward-Decoupled
      Normalization Policy Optimization"), so a reward with a large spread cannot drown a
      small-spread one in the weighted sum;
    - "batch": (r - mean) / (std + eps) over all N rows (0 when they are all equal);
    - "none": unchanged.

    Stds are unbiased (Bessel-corrected), as in the GRPO advantages.
    """
    if how == "none":
        return rewards
    if how == "group":
        if group_size < 2 or rewards.numel() % group_size:
            raise ValueError(f"group reward normalisation needs groups of >= 2 rows dividing N={rewards.numel()}, "
                             f"got group_size {group_size}")
        grouped = rewards.view(-1, group_size)
    elif how == "batch":
        grouped = rewards.view(1, -1)
    else:
        raise ValueError(f"unknown reward normalisation {how!r}; expected 'none', 'group' or 'batch'")
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    z = centred / (grouped.std(dim=1, keepdim=True) + eps) if grouped.shape[1] > 1 else torch.zeros_like(centred)
    equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(equal, torch.zeros_like(z), z).reshape(-1)


def combine_rewards(per_source: dict[str, Tensor], weights: Sequence[float] | None,
                    normalization: RewardNormalization = "none", group_size: int = 1) -> Tensor:
    """Weighted sum of the sources' (N,) rewards, in the order of `per_source` -> (N,), each first
    normalised on its own unless `normalization` is "none" (`normalize_reward`, groups of
    `group_size` rows)."""
    if not per_source:
        raise ValueError("no reward source: set reward_model and/or reward_fns")
    weights = [1.0] * len(per_source) if weights is None else list(weights)
    if len(weights) != len(per_source):
        raise ValueError(f"reward_weights has {len(weights)} entries but there are {len(per_source)} reward sources "
                         f"({', '.join(per_source)}): give one weight per source, reward model first")
    values = [v.float() if normalization == "none" else normalize_reward(v.float(), normalization, group_size)
              for v in per_source.values()]
    return sum(float(w) * v for w, v in zip(weights, values))
