"""The update loop of an online method: passes over a rollout in minibatches of whole groups,
gradient accumulation over micro-batches, clipping, optimizer and schedule steps.

A method's `update` calls `OnlineModule.run_updates(n_rows, passes, num_minibatches, loss_fn)`,
which runs `run_updates` here. Its contract:

- **Whole groups, every pass.** The rollout's rows come in groups of `group_size` (a prompt's
  copies: GRPO's G, RLOO's k, online DPO's pair), contiguous. A minibatch holds whole groups in
  every pass: the first pass keeps the rollout's order (its first micro-batch is the one the old
  log-probs were computed on: bitwise equal ratios, D7), every later pass shuffles the *groups*.
  A loss that reads a group at once (a pair loss) sets `whole_groups = True`: its micro-batches
  then hold whole groups too (`micro_batch_size` a multiple of the group size, checked).
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

from typing import Any, Callable, Iterable, Iterator, Union

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from lit_rlhf import distributed

LossResult = Union[tuple[Tensor, dict[str, Tensor]], Iterable[tuple[Tensor, dict[str, Tensor]]]]
StepLoss = Callable[[int, int], tuple[Tensor, dict[str, Tensor]]]  # (micro, micros) -> (loss, stats): `step_loss`


def loss_parts(result: LossResult, separate: bool = True) -> Iterator[tuple[Tensor, dict[str, Tensor]]]:
    """A `loss_fn` result as its parts: one (loss, stats) pair, or the pairs a generator yields
    (each computed only when the previous one's backward pass is done). `separate=False`: the
    parts summed into one (every part's forward pass first, then one backward pass)."""
    if isinstance(result, tuple):
        yield result
    elif separate:
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


def micro_rows(module: Any, n: int, group_size: int) -> int:
    """Rows per micro-batch of a minibatch of `n` rows: `micro_batch_size` (None = all), whole
    groups when the method's loss reads a group at once (`whole_groups`)."""
    micro = module.micro_batch_size or n
    if module.whole_groups and micro % group_size:
        raise ValueError(f"{type(module).__name__}'s loss reads whole groups of {group_size} rows: micro_batch_size "
                         f"({micro}) must be a multiple of {group_size}")
    return micro


def split_problems(module: Any, batch_size: int | None) -> list[str]:
    """Start-up check of the update's split: the rows a rollout's update trains on
    (`module.update_rows`) must divide into `num_minibatches` minibatches of whole groups."""
    from lit_rlhf import checks

    if not batch_size:
        return []
    rows, repeats = module.update_rows(batch_size), module.repeats
    sampled = f"batch_size ({batch_size}) x num_generations ({repeats})" if repeats > 1 else f"batch_size ({batch_size})"
    what = (f"a rollout has {sampled} = {rows} rows" if rows == batch_size * repeats
            else f"{type(module).__name__} updates on {rows} rows of each rollout ({sampled} sampled)")
    return checks.split_problem(rows, module.num_minibatches, what)


def minibatch_weight(rows: Tensor, row_weights: Tensor | None) -> Tensor | float:
    """The total weight a minibatch's micro-batch losses are divided by (see the module docstring)."""
    if row_weights is None:
        return float(len(rows))
    total = row_weights[rows].sum().float()
    if distributed.is_distributed():  # the global minibatch: every rank's rows, then DDP's 1/W
        total = distributed.all_reduce_sum(total) / distributed.world_size()
    return total.clamp(min=1e-6)  # a minibatch with no token in the loss (all masked): zero, not 0/0


def run_updates(module: Any, n_rows: int, epochs: int, num_minibatches: int, loss_fn: Callable[[Tensor], LossResult],
                row_weights: Tensor | None = None, group_size: int | None = None) -> dict[str, Tensor]:
    """`epochs` passes over the `n_rows` rows a method trains on in `num_minibatches` minibatches
    of whole groups, one optimizer step each (see the module docstring). `group_size`: rows per
    group, None = the rollout's (`module.repeats`); 1 for rows picked one per prompt (best-of-N).

    Returns the stats averaged over all micro-batches, plus `policy/first_ratio_mean` from the
    first one (exactly 1: D7)."""
    optimizer = module.optimizers()
    group = module.repeats if group_size is None else int(group_size)
    # DDP's gradient sync needs every trained parameter's gradient from each backward pass:
    # a loss's parts then run one backward pass of their sum
    separate = not isinstance(module.trainer.strategy.model, DistributedDataParallel)
    totals: dict[str, Tensor] = {}
    count = 0
    first: dict[str, Tensor] = {}
    for epoch in range(epochs):
        for rows in minibatches(n_rows, num_minibatches, group, shuffle=epoch > 0):
            micro = micro_rows(module, len(rows), group)
            total = minibatch_weight(rows, row_weights)
            extra = module.step_loss()  # a term of this optimizer step beyond the rollout's rows
            micros = -(-len(rows) // micro)

            def accumulate() -> bool:
                """Forward and backward over the minibatch's micro-batches; False when a loss is not
                finite (`on_nonfinite: skip`; `error` raises)."""
                nonlocal count, first
                for index, start in enumerate(range(0, len(rows), micro)):
                    part_rows = rows[start: start + micro]
                    share = len(part_rows) if row_weights is None else row_weights[part_rows].sum()
                    stats: dict[str, Tensor] = {}
                    for part, (loss, part_stats) in enumerate(loss_parts(loss_fn(part_rows), separate)):
                        loss = loss * (share / total)
                        if part == 0 and extra is not None:  # the step's own term, in the first part's backward
                            extra_loss, extra_stats = extra(index, micros)
                            loss, part_stats = loss + extra_loss, {**part_stats, **extra_stats}
                        if not module.check_finite(loss=loss):
                            return False
                        module.manual_backward(loss)
                        stats.update(part_stats)
                    if not first:
                        first = {k: v.detach() for k, v in stats.items()}
                    for k, v in stats.items():
                        totals[k] = totals.get(k, 0.0) + v.detach().float()
                    count += 1
                return True

            if module.optimizer_in_backward:  # each parameter updated by its backward pass, inside the step
                optimizer_step(module, optimizer, closure=accumulate)
            elif accumulate() and module.gradients_finite():
                optimizer_step(module, optimizer)
            else:
                optimizer.zero_grad(set_to_none=True)
    out = {k: v / max(count, 1) for k, v in totals.items()}
    if "policy/ratio_mean" in first:
        out["policy/first_ratio_mean"] = first["policy/ratio_mean"]
    return out


def optimizer_step(module: Any, optimizer: Any, closure: Callable[[], bool] | None = None) -> None:
    """Clip, step, zero the grads, advance the learning-rate schedule by one step (unless it
    advances per rollout: `step_lr_schedule` after the update then).

    With `closure` (`optimizer_in_backward`): the step runs the closure, whose backward pass
    updates each parameter as its gradient completes (`lit_rlhf.training.in_backward`); clipping
    is refused at start-up there."""
    max_norm = module.max_grad_norm
    if max_norm and closure is None:
        module.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
    if closure is not None:
        optimizer.step(closure=closure)
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if module.lr_schedule_per == "optimizer_step":
        step_lr_schedule(module)


def step_lr_schedule(module: Any) -> None:
    schedulers = module.lr_schedulers()
    for scheduler in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
        scheduler.step()
