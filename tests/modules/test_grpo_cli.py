"""configs/{tldr,ultrafeedback}/grpo.yaml through the CLI on the tiny model and bundled data."""

from __future__ import annotations

import pytest

from tests.modules.test_ppo_cli import CONFIGS, exported_reward_model, run_config, scalar_tags  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_tldr_grpo_config_fits(tmp_path, exported_reward_model):
    run_config(CONFIGS / "tldr" / "grpo.yaml", tmp_path, exported_reward_model, "bundled:tldr_sft",
               ["--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2",
                "--model.init_args.num_generations=2"])
    assert (tmp_path / "export" / "config.json").is_file()
    scalars, _ = scalar_tags(tmp_path / "tb")
    for tag in ("train/objective/scores", "train/objective/kl_loss", "train/rewards/group_std",
                "train/rewards/zero_std_fraction", "train/eos_trick/penalized", "val/objective/scores"):
        assert tag in scalars, (tag, sorted(scalars))


def test_ultrafeedback_grpo_config_fits(tmp_path, exported_reward_model):
    run_config(CONFIGS / "ultrafeedback" / "grpo.yaml", tmp_path, exported_reward_model,
               "bundled:ultrafeedback_binarized",
               ["--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2",
                "--model.init_args.num_generations=2", "--model.init_args.memory.gradient_checkpointing=false"])
    assert (tmp_path / "export" / "config.json").is_file()
    scalars, _ = scalar_tags(tmp_path / "tb")
    assert {"train/objective/scores", "train/objective/kl", "val/objective/scores"} <= scalars
