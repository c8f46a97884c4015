"""DROVModule fits through the CLI with configs/ultrafeedback/drov.yaml (tiny model, bundled data)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lit_rlhf.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ultrafeedback" / "drov.yaml"


def test_fit_on_bundled_ultrafeedback_with_two_learning_rates(tmp_path):
    cli = main([
        "fit", "--config", str(CONFIG),
        "--trainer.max_steps=3", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger=false", "--trainer.callbacks=[]",
        "--trainer.log_every_n_steps=1",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.dtype=float32",
        "--model.init_args.memory.gradient_checkpointing=false", "--model.init_args.export_dir=null",
        "--model.init_args.warmup_steps=0", "--model.init_args.value_lr=3e-4",
        "--data.init_args.path=bundled:ultrafeedback", "--data.init_args.train_split=train",
        "--data.init_args.val_split=null", "--data.init_args.limit=4",
        "--data.init_args.max_prompt_length=128", "--data.init_args.max_completion_length=48",
        "--data.init_args.truncate_completions=true", "--data.init_args.batch_size=4",
    ])
    module, trainer = cli.model, cli.trainer
    assert trainer.global_step == 3
    (optimizer,) = trainer.optimizers
    initial = {g["name"]: g["initial_lr"] for g in optimizer.param_groups}
    # the config's lr and the override, one AdamW; decay and no-decay groups named apart
    assert initial == {"policy": 1e-4, "policy/no_decay": 1e-4, "value": 3e-4, "value/no_decay": 3e-4}
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/policy/loss", "train/value/loss", "train/value/mean", "train/objective/logratio",
                "train/rewards/mean", "train/objective/dro"):
        assert key in metrics and math.isfinite(float(metrics[key])), key
    # the value network is saved with the module
    assert any(k.startswith("value.") for k in module.state_dict())


def test_value_warmup_fits_the_value_alone_first(tmp_path):
    """value_warmup_steps=2: the policy is unchanged through the first 2 steps while V moves;
    from step 3 on both move."""
    import lightning as L
    import torch

    from lit_rlhf.modules.drov import DROVModule
    from tests.modules.test_drov_module import grouped_batch

    class Record(L.Callback):
        def __init__(self):
            self.policy, self.value = [], []

        def on_train_batch_end(self, trainer, module, *args):
            self.policy.append(torch.cat([p.detach().flatten().clone() for p in module.policy.parameters()]))
            self.value.append(torch.cat([p.detach().flatten().clone() for p in module.value.parameters()]))

    torch.manual_seed(0)
    module = DROVModule(lr=1e-2, value_lr=1e-2, warmup_steps=0, value_warmup_steps=2)
    before_policy = torch.cat([p.detach().flatten().clone() for p in module.policy.parameters()])
    before_value = torch.cat([p.detach().flatten().clone() for p in module.value.parameters()])
    batch = grouped_batch(module.tokenizer)
    record = Record()
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[record],
                        default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader([batch] * 4, batch_size=None))
    assert trainer.global_step == 4
    assert torch.equal(record.policy[0], before_policy) and torch.equal(record.policy[1], before_policy)
    assert not torch.equal(record.value[0], before_value) and not torch.equal(record.value[1], record.value[0])
    assert not torch.equal(record.policy[2], before_policy)  # joint steps from the third on
    assert not torch.equal(record.policy[3], record.policy[2])
    with pytest.raises(ValueError, match="parameters of its own"):
        DROVModule(value="policy_logit", value_warmup_steps=2)
