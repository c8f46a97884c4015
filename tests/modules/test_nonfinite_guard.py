"""Nothing non-finite reaches the weights: a loss or gradient NaN errors, or skips and counts."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.modules import SFTModule
from lit_rlhf.training.base import NonFiniteError
from tests.modules.test_sft import make_batches, trainer


class PoisonedSFT(SFTModule):
    """Returns a NaN loss on the batches listed in `poison` (by batch_idx)."""

    def __init__(self, poison_loss=(), poison_grad=(), **kwargs):
        super().__init__(**kwargs)
        self.poison_loss, self.poison_grad = set(poison_loss), set(poison_grad)

    def nll_terms(self, batch):
        nll_sum, tokens = super().nll_terms(batch)
        if self.training and self._batch_idx in self.poison_loss:
            nll_sum = nll_sum * float("nan")
        return nll_sum, tokens

    def on_train_batch_start(self, batch, batch_idx):
        self._batch_idx = batch_idx
        super().on_train_batch_start(batch, batch_idx)

    def on_after_backward(self):
        if self._batch_idx in self.poison_grad:
            next(self.policy.parameters()).grad[0, 0] = float("inf")


def snapshot(module):
    return {k: v.clone() for k, v in module.policy.state_dict().items()}


def test_nan_loss_raises_naming_the_step(tmp_path):
    module = PoisonedSFT(poison_loss={0}, model="tiny-random-llama", lr=1e-2)
    with pytest.raises(NonFiniteError, match=r"non-finite loss at global step 0"):
        trainer(tmp_path, 2).fit(module, make_batches(module.tokenizer, batch_size=2))


def test_check_finite_names_bad_rows_and_dataset_ids():
    module = SFTModule(model="tiny-random-llama")
    batch = type("B", (), {"meta": {"index": [10, 11, 12]}})()
    rewards = torch.tensor([0.0, float("nan"), 1.0])
    with pytest.raises(NonFiniteError, match=r"non-finite rewards .*batch rows \[1\] \(dataset rows \[11\]\)"):
        module.check_finite(batch, rewards=rewards)


def test_nonfinite_gradient_raises(tmp_path):
    module = PoisonedSFT(poison_grad={0}, model="tiny-random-llama", lr=1e-2)
    with pytest.raises(NonFiniteError, match="non-finite gradient"):
        trainer(tmp_path, 2).fit(module, make_batches(module.tokenizer, batch_size=2))


@pytest.mark.parametrize("poison", ["loss", "grad"])
def test_skip_mode_skips_only_the_bad_steps_and_counts_them(tmp_path, poison):
    L.seed_everything(0)
    kwargs = {"poison_loss": {1}} if poison == "loss" else {"poison_grad": {1}}
    module = PoisonedSFT(model="tiny-random-llama", lr=1e-2, lr_scheduler="constant", on_nonfinite="skip", **kwargs)
    before = snapshot(module)
    loader = make_batches(module.tokenizer, batch_size=2)  # 2 batches per epoch: batch 1 is poisoned
    trainer(tmp_path, 2).fit(module, loader)
    assert module.skipped_steps == 1
    after = snapshot(module)
    assert all(torch.isfinite(v).all() for v in after.values())
    changed = any(not torch.equal(before[k], after[k]) for k in before)
    assert changed, "the good step must still update the weights"

    # the same run without the poisoned batch's update equals one good step
    L.seed_everything(0)
    clean = SFTModule(model="tiny-random-llama", lr=1e-2, lr_scheduler="constant")
    trainer(tmp_path, 1).fit(clean, make_batches(clean.tokenizer, batch_size=2))
    for k, v in clean.policy.state_dict().items():
        assert torch.allclose(v, after[k], atol=1e-7), k


def test_fp16_grad_scaler_owns_non_finite_gradients(monkeypatch):
    """Scaled fp16 gradients overflow by design; the GradScaler skips those steps, not the guard."""
    from types import SimpleNamespace

    module = SFTModule()
    param = next(module.policy.parameters())
    param.grad = torch.full_like(param, float("inf"))
    with pytest.raises(NonFiniteError, match="non-finite gradient"):
        module.gradients_finite()
    fake = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=torch.amp.GradScaler("cpu", enabled=False)))
    monkeypatch.setattr(type(module), "trainer", property(lambda self: fake))
    monkeypatch.setattr(module, "_trainer", fake, raising=False)
    assert module.gradients_finite()
