"""The update loop of an online method: passes over a rollout in minibatches of whole groups,
gradient accumulation over micro-batches, clipping, optimizer and schedule steps.

A method's `update` calls `OnlineModule.run_updates(n_rows, passes, num_minibatches, loss_fn)`
(`lit_rlhf.modules.online`), which runs on the helpers here. Its contract:

- **Whole groups, every pass.** The rollout's rows come in groups of `group_size` (a prompt's
  copies: GRPO's G, RLOO's k, online DPO's pair), contiguous. A minibatch holds whole groups in
  every pass: the first pass keeps the rollout's order (its first micro-batch is the one the old
  log-probs were computed on: bitwise equal ratios, D7), every later pass shuffles the *groups*.
  A loss that reads a group at once (a pair loss) sets `whole_groups = True`: its micro-batches
  then hold whole groups too (`micro_batch_size` a multiple of the group size, checked at start-up).
- **One meaning of `micro_batch_size`**: rows per forward pass, in scoring and in the update.
- **Exact accumulation.** Each micro-batch's loss is weighted by its share of the minibatch's
  total weight (rows, or `row_weights` such as response tokens, summed over ranks), so the
  accumulated gradient is that of the loss over the whole (global) minibatch.
- **Parts.** `loss_fn(rows)` returns (loss, stats) or yields such pairs, the parts of a loss whose
  terms train disjoint parameters (PPO: policy, value): each part's backward pass runs before the
  next is computed (one backward pass of their sum under DDP, whose gradient sync needs it).
- A method's term of every optimizer step that is not a function of the rollout's rows
  (`OnlineModule.step_loss`, PPO-ptx) is added to each micro-batch's first part.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Union

import torch
from torch import Tensor

LossResult = Union[tuple[Tensor, dict[str, Tensor]], Iterable[tuple[Tensor, dict[str, Tensor]]]]
StepLoss = Callable[[int, int], tuple[Tensor, dict[str, Tensor]]]  # (micro, micros) -> (loss, stats): `step_loss`


def loss_parts(result: Iterable[tuple[Tensor, dict[str, Tensor]]],
               separate: bool = True) -> Iterator[tuple[Tensor, dict[str, Tensor]]]:
    """The parts of a loss, the (loss, stats) pairs a `loss_fn` generator yields (each computed
    only when the previous one's backward pass is done). `separate=False`: the parts summed into
    one (every part's forward pass first, then one backward pass)."""
    if separate:
        yield from result
    else:
        parts = list(result)
        loss, stats = parts[0][0], dict(parts[0][1])
        for part_loss, part_stats in parts[1:]:
            loss = loss + part_loss
            stats.update(part_stats)
        yield loss, stats


def minibatches(n_rows: int, num_minibatches: int, group_size: int = 1, shuffle: bool = True) -> Iterator[Tensor]:
    """Row indices of `num_minibatches` minibatches of whole groups covering the rollout once: the
    groups in order, or in a random order (`shuffle`), each group's rows together and in order."""
    if n_rows % group_size:
        raise ValueError(f"the rollout's {n_rows} rows are not whole groups of {group_size}")
    n_groups = n_rows // group_size
    if n_groups % num_minibatches:
        raise ValueError(f"the rollout's {n_groups} groups of {group_size} rows do not split into "
                         f"num_minibatches={num_minibatches} equal minibatches")
    order = torch.randperm(n_groups) if shuffle else torch.arange(n_groups)
    rows = (order.unsqueeze(1) * group_size + torch.arange(group_size)).flatten()  # whole groups, in order
    return iter(rows.view(num_minibatches, -1))


def split_problem(method: str, batch_size: int, repeats: int, rows: int, num_minibatches: int) -> list[str]:
    """Start-up check of the update's split: the `rows` a rollout's update trains on (of
    `batch_size` prompts x `repeats` sampled) divide into `num_minibatches` minibatches."""
    from lit_rlhf import checks

    sampled = f"batch_size ({batch_size}) x num_generations ({repeats})" if repeats > 1 else f"batch_size ({batch_size})"
    what = (f"a rollout has {sampled} = {rows} rows" if rows == batch_size * repeats
            else f"{method} updates on {rows} rows of each rollout ({sampled} sampled)")
    return checks.split_problem(rows, num_minibatches, what)


def minibatch_weight(rows: Tensor, row_weights: Tensor | None) -> Tensor | float:
    """The total weight a minibatch's micro-batch losses are divided by (see the module docstring)."""
    if row_weights is None:
        return float(len(rows))
    total = row_weights[rows].sum().float()
    if torch.distributed.is_available() and torch.distributed.is_initialized():  # every rank's rows, then DDP's 1/W
        torch.distributed.all_reduce(total)
        total = total / torch.distributed.get_world_size()
    return total.clamp(min=1e-6)  # a minibatch with no token in the loss (all masked): zero, not 0/0
