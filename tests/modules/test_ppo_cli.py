"""configs/tldr/ppo.yaml through the CLI on the tiny model, with a reward model exported by RewardModule."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rlhf.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def exported_reward_model(tmp_path_factory):
    from lit_rlhf.modules import RewardModule

    directory = tmp_path_factory.mktemp("rm") / "hf_model"
    RewardModule(model="tiny-random-llama").export_hf(directory)
    return directory


def scalar_tags(log_dir: Path) -> tuple[set[str], set[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars, texts = set(), set()
    for events in log_dir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        scalars |= set(acc.Tags()["scalars"])
        texts |= set(acc.Tags().get("tensors", []))
    return scalars, texts


def run_config(config: Path, tmp_path: Path, reward_model: Path, data_path: str, extra: list[str] = ()):
    return main([
        "fit", "--config", str(config),
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32",
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger.init_args.save_dir", str(tmp_path / "tb"),
        "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.dtype=float32",
        "--model.init_args.reward_model", str(reward_model),
        "--model.init_args.max_new_tokens=6", "--model.init_args.micro_batch_size=2",
        "--model.init_args.total_episodes=8", "--model.init_args.log_completions_every_n_steps=1",
        "--model.init_args.export_dir", str(tmp_path / "export"),
        "--data.init_args.path", data_path, "--data.init_args.limit=8",
        *extra,
    ])


def test_tldr_ppo_config_fits(tmp_path, exported_reward_model):
    run_config(CONFIGS / "tldr" / "ppo.yaml", tmp_path, exported_reward_model, "bundled:tldr_sft",
               ["--data.init_args.batch_size=4", "--data.init_args.eval_batch_size=2"])
    assert (tmp_path / "export" / "config.json").is_file()
    scalars, texts = scalar_tags(tmp_path / "tb")
    for tag in ("train/objective/scores", "train/objective/kl", "train/objective/kl_coef", "train/policy/clipfrac",
                "train/value/vpred", "train/eos_trick/penalized", "train/rewards/reward_model", "val/objective/scores"):
        assert tag in scalars, (tag, sorted(scalars))
    assert any("completions" in t for t in texts), texts


def test_tldr_ppo_ptx_config_fits(tmp_path, exported_reward_model):
    """configs/tldr/ppo_ptx.yaml: its SFT stream on the bundled TL;DR SFT rows (given as the whole
    `ptx_data` mapping, as on a command line), one SFT batch per optimizer step, `train/loss/ptx`
    logged."""
    import json

    ptx_data = {"class_path": "lit_rlhf.data.TLDRSFTDataModule",
                "init_args": {"path": "bundled:tldr_sft", "max_prompt_length": 512, "max_completion_length": 53,
                              "batch_size": 3, "limit": 8}}
    cli = run_config(CONFIGS / "tldr" / "ppo_ptx.yaml", tmp_path, exported_reward_model, "bundled:tldr_sft",
                     ["--data.init_args.batch_size=4", "--data.init_args.eval_batch_size=2",
                      "--model.init_args.ptx_data", json.dumps(ptx_data)])
    assert (tmp_path / "export" / "config.json").is_file()
    scalars, _ = scalar_tags(tmp_path / "tb")
    for tag in ("train/loss/ptx", "train/policy/loss", "train/value/loss", "train/objective/scores"):
        assert tag in scalars, (tag, sorted(scalars))
    assert cli.trainer.global_step == cli.model.ptx_batches == 8  # 2 rollouts x 4 PPO epochs
