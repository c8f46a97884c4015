"""optimizer_in_backward: AdamW stepped parameter by parameter inside the backward pass.

Same weights, optimizer state and checkpoints as the whole-model step (bitwise: every AdamW
kernel is elementwise per tensor, so stepping one tensor at a time changes no arithmetic), exact
resume across the two paths, at most one `.grad` alive at a time, and a clear refusal of what it
cannot do exactly.
"""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy, ModelParallelStrategy

from lit_rlhf.training.memory import Memory
from lit_rlhf import checks
from lit_rlhf.modules import GRPOModule, SFTModule
from lit_rlhf.training.base import NonFiniteError
from lit_rlhf.training import in_backward
from lit_rlhf.training.in_backward import InBackwardAdamW, InBackwardError
from lit_rlhf.training.optim import build_adamw, decay_groups
from tests.resume.harness import CASES, Interrupt, Setup, assert_same_run, checkpoint_values, fit

pytestmark = pytest.mark.usefixtures("one_thread")  # bitwise-reproducible CPU kernels

HYPER = {"lr": 1e-2, "eps": 1e-5, "betas": (0.9, 0.95), "weight_decay": 0.1}
# cosine decay after one warmup step, weight decay on the matrices: every group hyperparameter moves
SCHEDULE = dict(lr_scheduler="cosine", warmup_steps=1, weight_decay=0.1)


# --------------------------------------------------------------------------------------------
# the optimizer alone
# --------------------------------------------------------------------------------------------


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 1))


def loss_of(net):
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    return net(x).pow(2).mean()


@pytest.mark.parametrize("fused", [True, False])
def test_same_updates_and_state_as_the_whole_model_step(fused):
    nets, optimizers = [], []
    for in_backward in (False, True):
        net = small_net()
        groups = decay_groups(net, HYPER["weight_decay"])
        optimizer = (InBackwardAdamW if in_backward else torch.optim.AdamW)(groups, fused=fused or None, **HYPER)
        if in_backward:
            optimizer.attach()
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
        for _ in range(3):
            optimizer.zero_grad()
            optimizer.step(lambda: loss_of(net).backward())
            scheduler.step()
        nets.append(net)
        optimizers.append(optimizer)
    plain, ours = nets
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), ours.parameters()))
    assert all(p.grad is None for p in ours.parameters())  # every gradient freed in the backward
    a, b = optimizers[0].state_dict(), optimizers[1].state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i, state in a["state"].items():
        assert state.keys() == b["state"][i].keys()
        for key, value in state.items():
            assert value.dtype == b["state"][i][key].dtype and torch.equal(value, b["state"][i][key]), (i, key)


def test_a_second_backward_in_one_step_and_a_backward_outside_a_step_raise():
    net = small_net()
    optimizer = InBackwardAdamW(net.parameters(), **HYPER)
    optimizer.attach({id(p): n for n, p in net.named_parameters()})

    def twice():
        loss_of(net).backward()
        loss_of(net).backward()

    with pytest.raises(InBackwardError, match=r"2\.bias got a gradient twice in one optimizer step"):
        optimizer.step(twice)
    with pytest.raises(InBackwardError, match="outside the optimizer step"):
        loss_of(net).backward()
    optimizer.detach()  # a plain AdamW again: gradients stay for its step
    loss_of(net).backward()
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize("fused", [True, False])
def test_a_nonfinite_gradient_is_refused_before_its_update(fused):
    """Fused: the kernel's found_inf flag skips the update (no sync per parameter), the error
    follows the backward pass; per-tensor: the error comes at once. Either way the weight and its
    moments stay finite and unchanged."""
    net = small_net()
    optimizer = InBackwardAdamW(net.parameters(), fused=fused or None, **HYPER)
    optimizer.attach({id(p): n for n, p in net.named_parameters()}, nonfinite_error=FloatingPointError)
    optimizer.step(lambda: loss_of(net).backward())  # one good step: the moments exist
    before = [p.detach().clone() for p in net.parameters()]
    moments = {k: v.clone() for k, v in optimizer.state[net[0].weight].items()}
    handle = net[0].weight.register_hook(lambda g: g * float("nan"))  # the first layer's gradient goes NaN
    with pytest.raises(FloatingPointError, match=r"non-finite gradient in 0\.weight$"):
        optimizer.step(lambda: loss_of(net).backward())
    assert torch.equal(net[0].weight, before[0])  # not updated
    assert all(torch.equal(optimizer.state[net[0].weight][k], v) for k, v in moments.items())  # step count too
    assert all(torch.isfinite(p).all() for p in net.parameters())
    handle.remove()
    optimizer.step(lambda: loss_of(net).backward())  # the flags of the failed step are gone


def test_build_adamw_in_backward_keeps_the_fused_groups():
    optimizer = build_adamw(decay_groups(small_net(), 0.1), None, in_backward=True, **HYPER)
    assert isinstance(optimizer, InBackwardAdamW) and optimizer.defaults["fused"] is True
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


# --------------------------------------------------------------------------------------------
# modules: the same run, exact resume, memory
# --------------------------------------------------------------------------------------------


def final_values(setup: Setup, tmp_path):
    run = fit(setup, tmp_path)
    assert run.exit_code is None and not run.killed and run.trainer.global_step == 4
    return checkpoint_values(tmp_path / "checkpoints" / "last.ckpt"), run


@pytest.mark.parametrize("name,memory", [
    ("sft", {}),
    ("dpo", {}),
    ("dpo", {"gradient_checkpointing": True}),
    ("drov", {}),  # two learning rates (policy, value) in one AdamW
    ("reward", {}),
    ("kto", {}),
    ("dpo_lora", {}),  # LoRA: the adapters only, the reference is the base with them off
])
def test_same_run_as_the_whole_model_step(name, memory, tmp_path):
    """4 steps, cosine schedule after warmup, weight decay: every weight, optimizer moment, step
    count, scheduler state and logged scalar bitwise equal."""
    plain, plain_run = final_values(Setup(name, module_args={**SCHEDULE, "memory": Memory(**memory)}), tmp_path / "plain")
    ours, ours_run = final_values(Setup(name, module_args={**SCHEDULE, "memory": Memory(optimizer_in_backward=True, **memory)}),
                                  tmp_path / "ours")
    assert isinstance(ours_run.trainer.optimizers[0], InBackwardAdamW)
    assert plain.keys() == ours.keys()
    assert any(k.startswith("optimizer_states/0/state/") for k in ours)
    different = [k for k in plain if not (torch.equal(plain[k], ours[k]) if isinstance(plain[k], torch.Tensor)
                                          else plain[k] == ours[k])]
    assert not different, different[:8]
    assert plain_run.recorder.metrics == ours_run.recorder.metrics
    assert plain_run.recorder.metrics[4]  # the logged scalars are there to compare


@pytest.mark.parametrize("first,then", [(True, True), (False, True), (True, False)],
                         ids=["in-backward", "plain-then-in-backward", "in-backward-then-plain"])
def test_resume_equals_the_uninterrupted_run(first, then, tmp_path):
    """SIGTERM after step 2 (the run checkpoints and stops), resume to step 4, with the option on
    either side: the same as 4 uninterrupted plain steps (weights, optimizer state, logged scalars)."""
    straight = fit(Setup("sft", module_args=SCHEDULE), tmp_path / "straight")
    root = tmp_path / "split"
    stopped = fit(Setup("sft", module_args={**SCHEDULE, "memory": Memory(optimizer_in_backward=first)}), root,
                  Interrupt("on_train_batch_end", n=2))
    assert stopped.exit_code == 75 and 2 <= stopped.trainer.global_step < 4  # stopped mid-run, checkpointed
    final = fit(Setup("sft", module_args={**SCHEDULE, "memory": Memory(optimizer_in_backward=then)}), root, None,
                str(root / "checkpoints" / "last.ckpt"))
    assert final.exit_code is None
    assert_same_run(straight, [stopped], final, tmp_path / "straight", root)


class LiveGradients(L.Callback):
    """The largest total of `.grad` bytes alive at once during the backward passes: read at each
    parameter's gradient completion (hooks registered before the optimizer's, so they run first)."""

    def __init__(self) -> None:
        self.peak = 0
        self.params: list[torch.nn.Parameter] = []

    def setup(self, trainer, pl_module, stage):
        self.params = [p for p in pl_module.parameters() if p.requires_grad]
        for param in self.params:
            param.register_post_accumulate_grad_hook(self.read)

    def read(self, _param) -> None:
        live = sum(p.grad.nbytes for p in self.params if p.grad is not None)
        self.peak = max(self.peak, live)


@pytest.mark.parametrize("in_backward", [False, True])
def test_at_most_one_gradient_alive(in_backward, tmp_path):
    tracker = LiveGradients()
    module_cls, module_args, _, dm_cls, dm_args = CASES["sft"]
    L.seed_everything(0)
    module = module_cls(model="tiny-random-llama", **module_args, memory=Memory(optimizer_in_backward=in_backward))
    dm = dm_cls(tokenizer="tiny-random-llama", val_split=None, test_split=None, **dm_args)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[tracker],
                        default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    total = sum(p.nbytes for p in tracker.params)
    largest = max(p.nbytes for p in tracker.params)
    assert trainer.global_step == 2
    if in_backward:
        assert tracker.peak == largest < total  # one gradient at a time, freed by its update
        # after the fit the hooks are gone: a backward pass only computes gradients
        sum(p.sum() for p in tracker.params).backward()
        assert all(p.grad is not None for p in tracker.params)
    else:
        assert tracker.peak == total  # every gradient held until the step


# --------------------------------------------------------------------------------------------
# what it cannot do exactly: refused at start-up, naming the setting
# --------------------------------------------------------------------------------------------


def fake_trainer(**overrides):
    values = dict(gradient_clip_val=None, accumulate_grad_batches=1, strategy=None, world_size=1,
                  precision="32-true", precision_plugin=SimpleNamespace(scaler=None), datamodule=None, callbacks=[])
    return SimpleNamespace(**{**values, **overrides})


@pytest.fixture(scope="module")
def sft_in_backward():
    return SFTModule(model="tiny-random-llama", memory=Memory(optimizer_in_backward=True))


@pytest.mark.parametrize("overrides,named", [
    ({"gradient_clip_val": 1.0}, "trainer.gradient_clip_val"),
    ({"accumulate_grad_batches": 2}, "trainer.accumulate_grad_batches=2"),
    ({"world_size": 2}, "the 2 processes"),
    ({"strategy": DeepSpeedStrategy(stage=2)}, "DeepSpeed"),
    ({"strategy": ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)}, "FSDP shards"),  # FSDP2
    ({"precision": "16-mixed", "precision_plugin": SimpleNamespace(scaler=object())}, "GradScaler"),
])
def test_refused_trainer_settings(sft_in_backward, overrides, named):
    problems = in_backward.startup_problems(fake_trainer(**overrides), sft_in_backward, None)
    assert len(problems) == 1 and named in problems[0] and "optimizer_in_backward" in problems[0], problems
    assert in_backward.startup_problems(fake_trainer(), sft_in_backward, None) == []


def test_refused_module_settings():
    skip = SFTModule(model="tiny-random-llama", memory=Memory(optimizer_in_backward=True), on_nonfinite="skip")
    assert "on_nonfinite: skip" in in_backward.startup_problems(fake_trainer(), skip, None)[0]
    off = SFTModule(model="tiny-random-llama", on_nonfinite="skip", memory=Memory(optimizer_in_backward=False))
    assert in_backward.startup_problems(fake_trainer(gradient_clip_val=1.0), off, None) == []
    grpo = GRPOModule(model="tiny-random-llama", reward_fns=[lambda prompts, completions, **_: [0.0] * len(prompts)],
                      num_generations=2, max_grad_norm=1.0, memory=Memory(optimizer_in_backward=True))
    problems = in_backward.startup_problems(fake_trainer(), grpo, None)  # online: see ..._online.py
    assert len(problems) == 1 and "max_grad_norm cannot clip" in problems[0], problems


def test_a_fit_with_clipping_fails_at_setup_before_any_step(tmp_path):
    module_cls, module_args, _, dm_cls, dm_args = CASES["sft"]
    module = module_cls(model="tiny-random-llama", **module_args, memory=Memory(optimizer_in_backward=True))
    dm = dm_cls(tokenizer="tiny-random-llama", val_split=None, test_split=None, **dm_args)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                        default_root_dir=tmp_path)
    with pytest.raises(checks.ConfigError, match="trainer.gradient_clip_val cannot clip"):
        trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 0


class PoisonedGradient(SFTModule):
    """The gradient of the final norm's weight turns NaN in the backward pass."""

    def on_train_start(self):
        super().on_train_start()
        self.policy.model.norm.weight.register_hook(lambda g: g * float("nan"))


def test_a_nonfinite_gradient_stops_the_fit_naming_the_parameter(tmp_path):
    module_cls, module_args, _, dm_cls, dm_args = CASES["sft"]
    module = PoisonedGradient(model="tiny-random-llama", **module_args, memory=Memory(optimizer_in_backward=True))
    dm = dm_cls(tokenizer="tiny-random-llama", val_split=None, test_split=None, **dm_args)
    before = module.policy.model.norm.weight.detach().clone()
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(NonFiniteError, match=r"non-finite gradient in policy\.model\.norm\.weight at global step 0"):
        trainer.fit(module, datamodule=dm)
    assert torch.equal(module.policy.model.norm.weight, before)
    assert all(torch.isfinite(p).all() for p in module.parameters())
