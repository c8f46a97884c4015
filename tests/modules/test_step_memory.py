"""What a training step holds in memory: no gradients of the previous step during the forward pass,
and no heap the C library keeps after a phase freed it (`release_host_memory`).

Lightning's automatic optimisation sets the gradients to None only after `training_step`; until
then the previous optimizer step's gradients (the size of the trained weights) stay alive through
the whole forward pass. `TrainingModule.free_stale_gradients` drops them when a step starts, at
the batches where Lightning would zero them anyway, so the training itself is unchanged: the
weights after a fit with gradient accumulation equal those of the old order, bit for bit.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lit_rlhf.training.memory import Memory
from lit_rlhf import host_memory
from lit_rlhf.modules import DPOModule, SFTModule
from lit_rlhf.training.base import TrainingModule
from lit_rlhf.types import PreferenceBatch, SFTBatch
from transformers.modeling_layers import GradientCheckpointingLayer
from tests.resume.harness import Setup
from tests.resume.harness import fit as fit_setup

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [5, 6, 7, 8, 9, 10]


def sft_batches(n: int) -> list[SFTBatch]:
    out = []
    for i in range(n):
        ids = torch.tensor([PROMPT + [11 + i, 12, 13, 2], PROMPT + [14, 15 + i, 2, 2]])
        loss_mask = torch.zeros_like(ids, dtype=torch.bool)
        loss_mask[:, len(PROMPT):] = True
        out.append(SFTBatch(ids, torch.ones_like(ids, dtype=torch.bool), loss_mask))
    return out


def preference_batches(n: int) -> list[PreferenceBatch]:
    return [PreferenceBatch(b.input_ids, b.attention_mask, b.loss_mask, torch.full((2,), len(PROMPT)), meta={"index": [i, i]})
            for i, b in enumerate(sft_batches(n))]


class GradientsAtForward(L.Callback):
    """Whether any parameter of the trained model holds a gradient when its differentiable forward
    pass starts (at its input embedding: the log-prob paths may call the decoder directly)."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        policy = pl_module.policy

        def record(module, args) -> None:
            if torch.is_grad_enabled():
                self.seen.append(any(p.grad is not None for p in policy.parameters()))

        policy.get_input_embeddings().register_forward_pre_hook(record)


def fit(module, batches: list, accumulate: int, callback: L.Callback | None = None) -> None:
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                        accumulate_grad_batches=accumulate, callbacks=[callback] if callback else [])
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None, collate_fn=lambda item: item))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_no_gradient_of_an_earlier_step_lives_through_the_forward_pass(accumulate):
    module = SFTModule(model="tiny-random-llama", lr=1e-3, warmup_ratio=0.0)
    seen = GradientsAtForward()
    fit(module, sft_batches(4), accumulate, seen)
    # a batch that continues an accumulation window still sees (and adds to) the window's gradients
    assert seen.seen == ([False] * 4 if accumulate == 1 else [False, True, False, True])


def test_dpo_policy_forward_starts_without_gradients():
    module = DPOModule(model="tiny-random-llama", lr=1e-3, warmup_ratio=0.0)
    seen = GradientsAtForward()
    fit(module, preference_batches(3), 1, seen)
    assert seen.seen == [False] * 3


@pytest.mark.parametrize("make", [lambda: SFTModule(model="tiny-random-llama", lr=1e-3, warmup_ratio=0.0),
                                  lambda: DPOModule(model="tiny-random-llama", lr=1e-3, warmup_ratio=0.0)])
def test_fit_is_unchanged_by_dropping_the_gradients_early(make, monkeypatch):
    batches = sft_batches(4) if isinstance(make(), SFTModule) else preference_batches(4)

    def trained(keep_stale: bool) -> dict[str, torch.Tensor]:
        if keep_stale:  # the order before: gradients dropped by Lightning only after training_step
            monkeypatch.setattr(TrainingModule, "free_stale_gradients", lambda self, batch_idx: None)
        torch.manual_seed(0)
        module = make()
        fit(module, batches, accumulate=2)
        monkeypatch.undo()
        return {n: p.detach().clone() for n, p in module.policy.named_parameters()}

    early, late = trained(False), trained(True)
    assert early.keys() == late.keys()
    for name in early:
        assert torch.equal(early[name], late[name]), name
    assert any(not torch.equal(early[n], p) for n, p in make().policy.named_parameters())  # the fit did train


# --------------------------------------------------------------------------------------------
# release_host_memory: the freed heap goes back to the system at the step's phase boundaries
# --------------------------------------------------------------------------------------------


class PhaseLog(L.Callback):
    """The step's phases in order, with every `host_memory.release_freed_memory` call between."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[str] = []
        monkeypatch.setattr(host_memory, "release_freed_memory", lambda: self.events.append("release") or True)

    def on_train_batch_start(self, *args) -> None:
        self.events.append("start")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.events.append("backward")  # callbacks run before the module's own hook

    def on_before_optimizer_step(self, *args) -> None:
        self.events.append("step")


@pytest.mark.parametrize("accumulate", [1, 2])
def test_freed_heap_is_released_before_each_backward_pass_and_after_each_batch(accumulate, monkeypatch):
    log = PhaseLog(monkeypatch)
    fit(SFTModule(model="tiny-random-llama", lr=1e-3, memory=Memory(release_host_memory="phases")), sft_batches(4), accumulate, log)
    one = ["start", "backward", "release", "release"]  # forward, (release) backward, ..., (release) at the batch end
    stepped = ["start", "backward", "release", "step", "release"]
    expected = stepped * 4 if accumulate == 1 else (one + stepped) * 2
    assert log.events == expected


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_online_methods_release_after_the_rollout_and_before_each_backward_pass(name, tmp_path, monkeypatch):
    """The rollout (generation, frozen models' scores) is freed before the first backward pass of
    the update; PPO's policy and value parts are two backward passes, each preceded by a release."""
    log = PhaseLog(monkeypatch)
    run = fit_setup(Setup(name, module_args={"memory": Memory(release_host_memory="phases")}), tmp_path, log)
    assert run.exit_code is None and not run.killed
    events = log.events
    backwards = [i for i, e in enumerate(events) if e == "backward"]
    assert backwards and all(events[i + 1] == "release" for i in backwards)
    batch_ends = [i - 1 for i, e in enumerate(events) if e == "start"][1:] + [len(events) - 1]
    assert all(events[i] == "release" for i in batch_ends)
    assert events.count("release") == len(backwards) + len(batch_ends)


def test_off_by_default_never_releases_and_neither_setting_changes_the_fit(monkeypatch):
    def trained(release: bool) -> tuple[dict[str, torch.Tensor], list[str]]:
        torch.manual_seed(0)
        module = DPOModule(model="tiny-random-llama", lr=1e-3, memory=Memory(release_host_memory="phases" if release else None))
        log = PhaseLog(monkeypatch)
        fit(module, preference_batches(3), 1, log)
        monkeypatch.undo()
        return {n: p.detach().clone() for n, p in module.policy.named_parameters()}, log.events

    released, events = trained(True)
    kept, kept_events = trained(False)
    assert events.count("release") == 6 and "release" not in kept_events
    for name in released:  # the real malloc_trim only moves free pages: bitwise the same training
        assert torch.equal(released[name], kept[name]), name


def test_release_on_cpu_only(monkeypatch):
    module = SFTModule(model="tiny-random-llama", memory=Memory(release_host_memory="phases"))
    calls = []
    monkeypatch.setattr(host_memory, "release_freed_memory", lambda: calls.append(1) or True)
    module.release_freed_host_memory()
    monkeypatch.setattr(type(module), "device", property(lambda self: torch.device("cuda", 0)))
    module.release_freed_host_memory()  # GPU tensors are not in the host heap: nothing to do
    assert calls == [1]


def test_warns_where_the_c_library_cannot_release(monkeypatch):
    monkeypatch.setattr(host_memory, "available", lambda: False)
    with pytest.warns(UserWarning, match="release_host_memory: phases has no effect here"):
        fit(SFTModule(model="tiny-random-llama", memory=Memory(release_host_memory="phases")), sft_batches(1), 1)


def layer_count(module) -> int:
    return sum(isinstance(m, GradientCheckpointingLayer) for m in module.modules())


@pytest.mark.parametrize("checkpointing", [False, True])
def test_layers_also_release_before_each_decoder_layer_run_with_gradients(checkpointing, monkeypatch):
    """`layers`: one release before each decoder layer of the training forward pass, and with
    gradient checkpointing again before each layer's recomputation in the backward pass."""
    log = PhaseLog(monkeypatch)
    module = SFTModule(model="tiny-random-llama", lr=1e-3, memory=Memory(release_host_memory="layers", gradient_checkpointing=checkpointing))
    layers = layer_count(module)
    fit(module, sft_batches(2), 1, log)
    forward, recompute = ["release"] * layers, ["release"] * layers * checkpointing
    assert log.events == (["start", *forward, "backward", "release", *recompute, "step", "release"]) * 2
    assert all(not m._forward_pre_hooks for m in module.modules())  # the hooks go with the fit


def test_layers_leave_generation_and_the_frozen_models_alone(tmp_path, monkeypatch):
    """GRPO: between a batch's start and its first backward pass only the policy's training
    forward releases (one per layer): not the sampling, nor the reference's scoring."""
    log = PhaseLog(monkeypatch)
    run = fit_setup(Setup("grpo", module_args={"memory": Memory(release_host_memory="layers")}), tmp_path, log)
    assert run.exit_code is None and not run.killed
    layers = layer_count(run.module.policy)
    events = log.events
    starts = [i for i, e in enumerate(events) if e == "start"]
    assert starts
    for i in starts:
        first_backward = events.index("backward", i)
        assert events[i + 1:first_backward] == ["release"] * layers


def test_unknown_release_setting_is_refused():
    with pytest.raises(ValueError, match="release_host_memory must be null, 'phases' or 'layers'"):
        SFTModule(model="tiny-random-llama", memory=Memory(release_host_memory="always"))
