"""Mixed precision: gradient clipping with the fused AdamW under bf16, fp32 master weights, the
start-up check against low-precision trainable weights, named parameter groups."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from lit_rlhf import checks
from lit_rlhf.modules import SFTModule
from lit_rlhf.training.optim import decay_groups
from tests.modules.test_sft import make_batches

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class GradNorm(Callback):
    """The total gradient norm the optimizer stepped with (after clipping; Lightning zeroes the
    gradients at the start of the next step)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads:
            self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads]))))


def fit(tmp_path, steps=1, lr=1e-3, dtype="float32", precision="32", callbacks=(), **trainer_kwargs):
    torch.manual_seed(0)
    module = SFTModule(model="tiny-random-llama", lr=lr, dtype=dtype, lr_scheduler="constant")
    before = {n: p.detach().float().clone() for n, p in module.policy.named_parameters()}
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                        precision=precision, callbacks=list(callbacks), **trainer_kwargs)
    trainer.fit(module, make_batches(module.tokenizer))
    return module, before


def test_bf16_mixed_clips_the_fused_adamw(tmp_path):
    norms = GradNorm()
    module, _ = fit(tmp_path, precision="bf16-mixed", gradient_clip_val=1e-3, callbacks=[norms])
    assert module.optimizers().optimizer.defaults["fused"] is True  # the fast kernel is kept
    assert norms.norms and norms.norms[0] <= 1e-3 * 1.01


def test_decay_groups_of_two_models_have_distinct_names():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    groups = decay_groups(a, 0.1, name="policy") + decay_groups(b, 0.1, name="value", lr=1.0)
    assert [g["name"] for g in groups] == ["policy", "policy/no_decay", "value", "value/no_decay"]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0, 0.1, 0.0]
    assert "name" not in decay_groups(a, 0.1)[0]


def low_precision_problems(dtype: torch.dtype, precision: str, strategy=None):
    module = torch.nn.Linear(4, 4).to(dtype)
    module.model_dtype = str(dtype).removeprefix("torch.")
    return checks._low_precision_weights(SimpleNamespace(precision=precision, strategy=strategy), module, None)


def test_low_precision_trainable_weights_are_refused_with_what_to_change():
    (problem,) = low_precision_problems(torch.bfloat16, "bf16-mixed")
    assert "no fp32" in problem and "dtype: float32" in problem and "bf16-true" in problem and "DeepSpeed" in problem
    assert low_precision_problems(torch.float16, "32-true")
    assert not low_precision_problems(torch.float32, "bf16-mixed")
    assert not low_precision_problems(torch.bfloat16, "bf16-true")  # pure bf16 on purpose
    from lightning.pytorch.strategies import DeepSpeedStrategy

    assert not low_precision_problems(torch.bfloat16, "bf16-mixed", DeepSpeedStrategy(stage=2))  # its own master copy


def test_a_fit_with_bf16_weights_under_bf16_mixed_stops_before_training(tmp_path):
    with pytest.raises(checks.ConfigError, match="bf16-true"):
        fit(tmp_path, dtype="bfloat16", precision="bf16-mixed")


def moved_fraction(module, before) -> float:
    moved = total = 0
    for name, param in module.policy.named_parameters():
        moved += int((param.detach().float() != before[name]).sum())
        total += param.numel()
    return moved / total


@pytest.mark.parametrize("config", sorted((CONFIGS / "ultrafeedback").glob("*.yaml")), ids=lambda p: p.name)
def test_config_precision_moves_weights_like_fp32(tmp_path, config):
    """3 AdamW steps at the UltraFeedback learning rate with the config's dtype and precision
    change as many weights as in fp32 (bf16 weights stepped directly change ~1% of them)."""
    declared = yaml.safe_load(config.read_text())
    dtype = declared["model"]["init_args"].get("dtype", "float32")
    precision = str(declared["trainer"].get("precision", "32"))
    module, before = fit(tmp_path / "config", steps=3, lr=5e-7, dtype=dtype, precision=precision)
    reference, ref_before = fit(tmp_path / "fp32", steps=3, lr=5e-7)
    fp32 = moved_fraction(reference, ref_before)
    assert fp32 > 0.5  # rows of tokens absent from the batch get no gradient
    assert moved_fraction(module, before) >= 0.95 * fp32


def test_pure_bf16_rounds_small_updates_away(tmp_path):
    """What the check protects against, measured: the same 3 steps on bf16 weights (pure bf16,
    chosen explicitly) leave most weights unchanged."""
    module, before = fit(tmp_path, steps=3, lr=5e-7, dtype="bfloat16", precision="bf16-true")
    assert moved_fraction(module, before) < 0.2
