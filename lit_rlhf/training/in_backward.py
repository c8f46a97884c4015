"""AdamW stepped inside the backward pass (`memory.optimizer_in_backward`, docs/guides/memory.md):
ONE `torch.optim.AdamW` (same groups, state and `state_dict`; either path resumes the other)
whose hook on each parameter, as soon as its gradient is complete, scales the gradient by
`gradient_factor()`, checks it is finite (for the fused kernel as its `found_inf` flag, raised
after the backward pass), runs AdamW's own kernel on that parameter alone (bitwise the
whole-model step: every kernel is elementwise) and frees the gradient; `step(closure)` only runs
the closure. A parameter reached twice in one `step`, or outside any, raises `InBackwardError`;
what cannot be done exactly is refused at start-up (`startup_problems`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import Tensor
from torch.optim.adam import adam
from torch.utils.hooks import RemovableHandle


class InBackwardError(RuntimeError):
    """A backward pass the in-backward optimizer cannot turn into exactly one AdamW step."""


class InBackwardAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` whose per-parameter updates run in the backward pass once `attach`
    registers the hooks (module docstring); until then, or after `detach`, a plain AdamW."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handles: list[RemovableHandle] = []
        self._group_of: dict[int, int] = {}  # id(param) -> index of its group (load_state_dict replaces the dicts)
        self._names: dict[int, str] = {}
        self._updated_in: dict[int, int] = {}  # id(param) -> the step number it was last updated in
        self._step_number = 0
        self._in_step = False
        self._factor: float | None = None  # gradient factor of the current step (read once)
        self._factor_read = False
        self._found_inf: list[tuple[Tensor, Tensor]] = []  # (param, 0./1. on its device) of this step
        self.gradient_factor: Callable[[], float | None] = lambda: None
        self.nonfinite_error: Callable[[str], BaseException] | None = None

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self, names: dict[int, str] | None = None, gradient_factor: Callable[[], float | None] | None = None,
               nonfinite_error: Callable[[str], BaseException] | None = None) -> None:
        """Register the update hook on every parameter of every group. `names`: `id(param) -> name`
        for the messages; `gradient_factor`: called once per step, a number scales every gradient
        of the step; `nonfinite_error(message)`: the exception for a non-finite gradient (None:
        not checked)."""
        self.detach()
        self._names = dict(names or {})
        if gradient_factor is not None:
            self.gradient_factor = gradient_factor
        self.nonfinite_error = nonfinite_error
        for index, group in enumerate(self.param_groups):
            for param in group["params"]:
                if id(param) in self._group_of:
                    raise InBackwardError(f"parameter {self._name(param)} is in two parameter groups")
                self._group_of[id(param)] = index
                self._handles.append(param.register_post_accumulate_grad_hook(self._hook))

    def detach(self) -> None:
        """Remove the hooks: from now on a plain AdamW."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._group_of = [], {}

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Inside: a plain AdamW on the same state (e.g. a textbook step to compare); hooks restored after."""
        if not self.attached:
            yield
            return
        settings = (self._names, self.gradient_factor, self.nonfinite_error)
        self.detach()
        try:
            yield
        finally:
            self.attach(*settings)

    def _name(self, param: Tensor) -> str:
        return self._names.get(id(param), f"<parameter of shape {tuple(param.shape)}>")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """Run `closure` (the parameters are updated as their gradients complete); unattached, a plain step."""
        if not self.attached:
            return super().step(closure)
        if closure is None:
            raise InBackwardError("the in-backward AdamW steps inside the backward pass of its closure: "
                                  "step() needs the closure that runs it")
        self._step_number += 1
        self._in_step, self._factor, self._factor_read, self._found_inf = True, None, False, []
        try:
            with torch.enable_grad():
                loss = closure()
            self._raise_if_nonfinite()
            return loss
        finally:
            self._in_step, self._found_inf = False, []

    def _raise_if_nonfinite(self) -> None:
        """After the backward pass: raise for the parameters whose fused update found a non-finite
        gradient (and skipped it); one host synchronisation."""
        if not self._found_inf or self.nonfinite_error is None:
            return
        device = self._found_inf[0][1].device
        if not bool(torch.stack([flag.to(device) for _, flag in self._found_inf]).any()):
            return
        bad = [self._name(param) for param, flag in self._found_inf if bool(flag)]
        raise self.nonfinite_error(f"non-finite gradient in {', '.join(bad)}")

    def _hook(self, param: Tensor) -> None:
        name = self._name(param)
        if not self._in_step:
            raise InBackwardError(
                f"a backward pass outside the optimizer step reached {name}: with optimizer_in_backward every "
                "backward pass must run inside the optimizer's step (automatic optimisation, one backward per step)")
        if self._updated_in.get(id(param)) == self._step_number:
            raise InBackwardError(
                f"{name} got a gradient twice in one optimizer step (a second backward pass): with "
                "optimizer_in_backward its first gradient was already applied; use one backward pass per step")
        self._updated_in[id(param)] = self._step_number
        if not self._factor_read:
            self._factor, self._factor_read = self.gradient_factor(), True
        self.update(param)

    @torch.no_grad()
    def update(self, param: Tensor) -> None:
        """One AdamW step of `param` alone (gradient scaled and checked), then free its gradient."""
        grad = param.grad
        if grad is None:
            return
        if self._factor is not None:
            grad.mul_(self._factor)
        group = self.param_groups[self._group_of[id(param)]]  # its current lr (the scheduler's)
        found_inf = None
        if self.nonfinite_error is not None:
            if group["fused"]:  # the kernel skips a flagged update; `step` raises after the backward
                found_inf = torch.isfinite(grad).all().logical_not().to(torch.float32)
                self._found_inf.append((param, found_inf))
            elif not bool(torch.isfinite(grad).all()):
                param.grad = None
                raise self.nonfinite_error(f"non-finite gradient in {self._name(param)}")
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
        # AdamW's own lazy state initialisation, on this one parameter (same state layout)
        has_complex = self._init_group({**group, "params": [param]}, params, grads, exp_avgs, exp_avg_sqs,
                                       max_exp_avg_sqs, steps)
        beta1, beta2 = group["betas"]
        adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad=group["amsgrad"],
             has_complex=has_complex, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
             eps=group["eps"], maximize=group["maximize"], foreach=group["foreach"], capturable=group["capturable"],
             differentiable=group["differentiable"], fused=group["fused"], grad_scale=None, found_inf=found_inf,
             decoupled_weight_decay=group["decoupled_weight_decay"])
        param.grad = None


def startup_problems(trainer: Any, module: Any, dm: Any) -> list[str]:
    """What `optimizer_in_backward` cannot do exactly (nothing may need all gradients, or a later
    one), one message each (`lit_rlhf.checks` raises them at start-up)."""
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

    if not getattr(module, "optimizer_in_backward", False):
        return []
    why = "optimizer_in_backward: true steps each parameter as soon as its gradient is complete in the backward pass"
    problems = []
    if not getattr(module, "automatic_optimization", True):
        problems += _one_backward_per_step(module, dm, why)
    if getattr(trainer, "gradient_clip_val", None) or getattr(module, "max_grad_norm", None):
        setting = "trainer.gradient_clip_val" if getattr(trainer, "gradient_clip_val", None) else "max_grad_norm"
        problems.append(f"{why}, before the norm of all gradients is known, so {setting} cannot clip them: unset "
                        f"{setting} or set optimizer_in_backward: false")
    if int(getattr(trainer, "accumulate_grad_batches", 1) or 1) > 1:
        problems.append(f"{why}, so trainer.accumulate_grad_batches={trainer.accumulate_grad_batches} cannot "
                        "accumulate gradients over batches: set accumulate_grad_batches: 1 (a larger batch instead) "
                        "or optimizer_in_backward: false")
    strategy = getattr(trainer, "strategy", None)
    if isinstance(strategy, DeepSpeedStrategy):
        problems.append(f"{why}, but the DeepSpeed engine owns the gradients and the step: set "
                        "optimizer_in_backward: false under DeepSpeed")
    elif isinstance(strategy, (FSDPStrategy, ModelParallelStrategy)):
        problems.append(f"{why}, but FSDP shards the gradients after the backward: set optimizer_in_backward: false")
    elif int(getattr(trainer, "world_size", 1) or 1) > 1:
        problems.append(f"{why}, before data parallelism averages it over the {trainer.world_size} processes: "
                        "train in one process or set optimizer_in_backward: false")
    if getattr(getattr(trainer, "precision_plugin", None), "scaler", None) is not None:
        problems.append(f"{why}, but under trainer.precision={str(trainer.precision)!r} the GradScaler must see all "
                        "gradients first (to unscale them and skip overflowing steps): use bf16-mixed or 32-true, "
                        "or optimizer_in_backward: false")
    if getattr(module, "on_nonfinite", "error") == "skip":
        problems.append(f"{why}, so on_nonfinite: skip cannot undo the updates already made when a later gradient "
                        "is non-finite: set on_nonfinite: error (it stops before any non-finite update) or "
                        "optimizer_in_backward: false")
    return problems


def _one_backward_per_step(module: Any, dm: Any, why: str) -> list[str]:
    """A manually optimising module under `optimizer_in_backward`: only the online update loop,
    and only when each optimizer step's minibatch is one micro-batch (one backward pass)."""
    name = type(module).__name__
    if getattr(module, "sampling", None) is None or not callable(getattr(module, "run_updates", None)):
        return [f"{why}, but {name} optimises manually: set optimizer_in_backward: false"]
    micro = module.micro_batch_size
    batch_size = getattr(dm, "batch_size", None)
    if not micro or not batch_size:
        return []  # the whole minibatch in one pass (a second backward pass would raise at once)
    rows = module.update_rows(batch_size) // max(1, module.num_minibatches)
    if micro >= rows:
        return []
    return [f"{why}, so each optimizer step must be one backward pass, but micro_batch_size={micro} splits {name}'s "
            f"minibatches of {rows} rows into {-(-rows // micro)}: set micro_batch_size: null (or >= {rows}), or "
            "optimizer_in_backward: false"]
