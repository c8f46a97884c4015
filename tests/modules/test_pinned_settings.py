"""Settings a subclass pins in `super().__init__(...)` survive the CLI: the module runs with them,
the checkpoint's hyper-parameters record them, and the module is rebuilt from that checkpoint."""

from __future__ import annotations

import pytest
import torch
import yaml

from lit_rlhf.cli import main
from lit_rlhf.export import load_module
from tests.modules.pinned import PinnedGRPO

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CONFIG = {
    "seed_everything": 1,
    "trainer": {"accelerator": "cpu", "devices": 1, "precision": "32", "max_steps": 2,
                "limit_val_batches": 0, "num_sanity_val_steps": 0, "enable_model_summary": False,
                "enable_progress_bar": False},
    "model": {"class_path": "tests.modules.pinned.PinnedGRPO",
              "init_args": {"model": "tiny-random-llama", "reward_fns": [{"class_path": "lit_rlhf.rewards.CharacterFractionReward"}],
                            "kl_coef": 0.0, "max_new_tokens": 4, "log_completions_every_n_steps": 0}},
    "data": {"class_path": "lit_rlhf.data.TLDRPromptDataModule",
             "init_args": {"path": "bundled:tldr_sft", "max_prompt_length": 96, "limit": 4, "batch_size": 2,
                           "val_split": None, "test_split": None}},
}


def test_a_setting_pinned_by_a_subclass_survives_the_cli(tmp_path):
    config = tmp_path / "pinned.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    cli = main(["fit", "--config", str(config), "--trainer.default_root_dir", str(tmp_path),
                "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
                "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                f"--trainer.callbacks.dirpath={tmp_path / 'ckpt'}", "--trainer.callbacks.save_last=true"])
    module = cli.model
    assert isinstance(module, PinnedGRPO) and cli.trainer.global_step == 2
    assert module.num_generations == 2 and module.repeats == 2
    assert module.episodes == 2 * 2 * 2  # 2 rollouts x 2 prompts x the pinned 2 completions each

    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    hparams = checkpoint["hyper_parameters"]
    assert hparams["num_generations"] == 2  # recorded, though the YAML never names it
    assert hparams["kl_coef"] == 0.0 and hparams["max_new_tokens"] == 4  # the config's own settings too

    (logged,) = tmp_path.rglob("hparams.yaml")  # the logger merged them with the DataModule's
    assert yaml.unsafe_load(logged.read_text())["num_generations"] == 2

    rebuilt = load_module(tmp_path / "ckpt" / "last.ckpt")  # what `python -m lit_rlhf.export` does
    assert isinstance(rebuilt, PinnedGRPO) and rebuilt.num_generations == 2
    for name, value in module.state_dict().items():
        torch.testing.assert_close(rebuilt.state_dict()[name], value, rtol=0, atol=0)
