"""The update side of `OnlineModule` (step 5 of `lit_rlhf.modules.online`): minibatches over a
rollout, gradient accumulation over micro-batches, clipping, optimizer and schedule steps, and
the truncated importance weights of the policy-gradient term.

`UpdateLoopMixin` holds the methods; `OnlineModule` mixes it in, and each method's `update`
calls `run_updates` with its loss. The same split is checked at start-up (`check_config`): the
rows a method's update trains on (`update_rows`) must divide into `num_minibatches`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Union

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from lit_rlhf import checks, distributed
from lit_rlhf.losses import truncated_importance_weights
from lit_rlhf.types import Rollout

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


class UpdateLoopMixin:
    """The update loop of an `OnlineModule` (a `PolicyModule` under manual optimization)."""

    num_minibatches: int = 1
    """Minibatches of each pass over the rollout, one optimizer step each (`run_updates`); GRPO and
    PPO set it from their `num_minibatches` argument."""

    def update_rows(self, prompts: int) -> int:
        """The rows `update` splits into `num_minibatches` minibatches, for a rollout of `prompts`
        prompts on one rank: every sampled response (`prompts * repeats`) here. A method that
        trains on a selection of them (best-of-N: the best response of each prompt) returns its
        count, so the start-up check (`check_config`) refuses the split the update could not make."""
        return prompts * self.repeats

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """The shared settings' problems (`PolicyModule`), then the update's split: `update_rows`
        of a rollout must divide into `num_minibatches` equal minibatches (else `run_updates`
        fails at the first step). A method adds its own to `super().check_config(...)`."""
        problems = super().check_config(trainer, datamodule) + self.environment_problems(trainer) + self.async_problems(trainer)
        batch_size = getattr(datamodule, "batch_size", None)
        if not batch_size:
            return problems
        rows, repeats = self.update_rows(batch_size), self.repeats
        sampled = f"batch_size ({batch_size}) x num_generations ({repeats})" if repeats > 1 else f"batch_size ({batch_size})"
        what = (f"a rollout has {sampled} = {rows} rows" if rows == batch_size * repeats
                else f"{type(self).__name__} updates on {rows} rows of each rollout ({sampled} sampled)")
        return problems + checks.split_problem(rows, self.num_minibatches, what)

    def tis_weights(self, rollout: Rollout, rows: Tensor, train_logps: Tensor) -> Tensor | None:
        """Truncated importance weights (n, R) of `rows` (`tis_cap`), None when TIS is off.
        `train_logps`: the trainer's log-probs of those rows at sampling time."""
        cap = self.tis_cap
        if cap is None or rollout.sampler_logps is None:
            return None
        return truncated_importance_weights(train_logps, rollout.sampler_logps[rows], rollout.response_mask[rows], cap)

    def step_loss(self) -> StepLoss | None:
        """A loss term of the next optimizer step that is not a function of the rollout's rows
        (PPO-ptx's language-modelling loss on SFT rows), or None (the default: none).

        `run_updates` calls it once per optimizer step, before that step's micro-batches, and then
        calls what it returns, `(micro, micros) -> (loss, stats)`, for each micro-batch `micro` of
        the step's `micros`: the loss is that micro-batch's share of the term, already normalised
        over the whole step (`run_updates` does not weigh it again), and is added to the
        micro-batch's first loss part, so it shares that part's backward pass (the policy's, for
        PPO: each parameter still gets one gradient per backward pass, as `optimizer_in_backward`
        needs, and under DDP every trained parameter is in each pass). Its stats are averaged
        over the micro-batches with the loss's."""
        return None

    def minibatches(self, n_rows: int, num_minibatches: int, shuffle: bool = True) -> Iterator[Tensor]:
        """Row indices of `num_minibatches` minibatches covering the rollout once."""
        if n_rows % num_minibatches:
            raise ValueError(f"the rollout's {n_rows} rows do not split into num_minibatches={num_minibatches} equal minibatches")
        order = torch.randperm(n_rows) if shuffle else torch.arange(n_rows)
        return iter(order.view(num_minibatches, -1))

    def run_updates(
        self,
        n_rows: int,
        epochs: int,
        num_minibatches: int,
        loss_fn: Callable[[Tensor], LossResult],
        row_weights: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """`epochs` passes over the rollout in `num_minibatches` minibatches, one optimizer step
        each, accumulating gradients over micro-batches of `micro_batch_size` rows.

        `loss_fn(rows)` gets the rollout row indices of a micro-batch and returns (loss, stats),
        the loss averaged over that micro-batch, or yields such pairs, the parts of a loss whose
        terms train disjoint parameters (PPO: policy, value): each part's backward pass runs
        before the next part is computed, so one network's activations are freed before the
        next network's forward pass (the same gradients as one backward pass of their sum,
        which is what runs under DDP). Each micro-batch's loss is weighted by its share
        of the minibatch's total weight, so the accumulated gradient is that of the loss over the
        whole minibatch, whatever `micro_batch_size`:

        - `row_weights` None: every row weighs 1 (a mean over sequences: the share of rows);
        - `row_weights` (N,): the weight of each row, e.g. its number of response tokens for a
          token-mean loss: a micro-batch's token mean times its tokens over the minibatch's tokens
          is its token sum over the minibatch's tokens. The minibatch total is summed over all
          ranks and multiplied by the world size (data parallelism averages the ranks'
          gradients), so the loss is the token mean of the GLOBAL minibatch.

        A method's term of every optimizer step that is not a function of the rollout's rows is
        added through `step_loss` (PPO-ptx).

        Returns the stats averaged over all micro-batches, plus `policy/first_ratio_mean` from the
        first one (exactly 1: D7).
        """
        optimizer = self.optimizers()
        in_backward = self.optimizer_in_backward
        # DDP's gradient sync needs every trained parameter's gradient from each backward pass:
        # a loss's parts then run one backward pass of their sum
        separate = not isinstance(self.trainer.strategy.model, DistributedDataParallel)
        totals: dict[str, Tensor] = {}
        count = 0
        first: dict[str, Tensor] = {}
        for epoch in range(epochs):
            # the first pass keeps the rollout's row order, so its first micro-batch is the one
            # the old log-probs were computed on (bitwise equal ratios, D7)
            for rows in self.minibatches(n_rows, num_minibatches, shuffle=epoch > 0):
                micro = self.micro_batch_size or len(rows)
                total = self.minibatch_weight(rows, row_weights)
                extra = self.step_loss()  # a term of this optimizer step beyond the rollout's rows
                micros = -(-len(rows) // micro)

                def accumulate() -> bool:
                    """Forward and backward over the minibatch's micro-batches; False when a loss
                    is not finite (`on_nonfinite: skip`; `error` raises)."""
                    nonlocal count, first
                    for index, start in enumerate(range(0, len(rows), micro)):
                        micro_rows = rows[start: start + micro]
                        share = len(micro_rows) if row_weights is None else row_weights[micro_rows].sum()
                        stats: dict[str, Tensor] = {}
                        for part, (loss, part_stats) in enumerate(loss_parts(loss_fn(micro_rows), separate)):
                            loss = loss * (share / total)
                            if part == 0 and extra is not None:  # the step's own term, in the first part's backward
                                extra_loss, extra_stats = extra(index, micros)
                                loss, part_stats = loss + extra_loss, {**part_stats, **extra_stats}
                            if not self.check_finite(loss=loss):
                                return False
                            self.manual_backward(loss)
                            stats.update(part_stats)
                        if not first:
                            first = {k: v.detach() for k, v in stats.items()}
                        for k, v in stats.items():
                            totals[k] = totals.get(k, 0.0) + v.detach().float()
                        count += 1
                    return True

                if in_backward:  # each parameter's gradient from one backward pass (lit_rlhf.checks), inside the step
                    self.apply_optimizer_step(optimizer, closure=accumulate)
                elif accumulate() and self.gradients_finite():
                    self.apply_optimizer_step(optimizer)
                else:
                    optimizer.zero_grad(set_to_none=True)
        out = {k: v / max(count, 1) for k, v in totals.items()}
        if "policy/ratio_mean" in first:
            out["policy/first_ratio_mean"] = first["policy/ratio_mean"]
        return out

    @staticmethod
    def minibatch_weight(rows: Tensor, row_weights: Tensor | None) -> Tensor | float:
        """The total weight a minibatch's micro-batch losses are divided by (see `run_updates`)."""
        if row_weights is None:
            return float(len(rows))
        total = row_weights[rows].sum().float()
        if distributed.is_distributed():  # the global minibatch: every rank's rows, then DDP's 1/W
            total = distributed.all_reduce_sum(total) / distributed.world_size()
        return total.clamp(min=1e-6)  # a minibatch with no token in the loss (all masked): zero, not 0/0

    def apply_optimizer_step(self, optimizer, closure: Callable[[], bool] | None = None) -> None:
        """Clip, step, zero the grads, advance the learning-rate schedule by one step (unless
        it advances per rollout: `step_lr_schedule` after the update then).

        With `closure` (`optimizer_in_backward`): the step runs the closure, whose backward pass
        updates each parameter as its gradient completes (`lit_rlhf.modules.in_backward`);
        clipping is refused at start-up there."""
        max_norm = self.max_grad_norm
        if max_norm and closure is None:
            self.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
        if closure is not None:
            optimizer.step(closure=closure)
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self.lr_schedule_per == "optimizer_step":
            self.step_lr_schedule()

    def step_lr_schedule(self) -> None:
        schedulers = self.lr_schedulers()
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
            scheduler.step()
