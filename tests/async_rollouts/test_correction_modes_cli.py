"""Every rollout-correction mode (`lit_rlhf.online.RolloutCorrection`: truncate or mask, per token,
sequence or geometric mean, DeepSeek-V3.2's off-policy sequence mask) fits GRPO, GSPO and RLOO on
asynchronous rollouts through the CLI, from YAML: the source carries the parsed correction and the
mismatch statistics are logged. The same matrix on the vLLM backend: tests/vllm/test_correction_modes.py."""

from __future__ import annotations

import math

import pytest
import yaml

from lit_rlhf.cli import main
from lit_rlhf.online import RolloutCorrection

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MODES = {
    "truncate_token": {"mode": "truncate", "level": "token", "upper": 2.0},
    "truncate_sequence": {"mode": "truncate", "level": "sequence", "upper": 2.0},
    "truncate_geometric": {"mode": "truncate", "level": "geometric", "upper": 2.0},
    "mask_token": {"mode": "mask", "level": "token", "lower": 0.5, "upper": 2.0},
    "mask_sequence": {"mode": "mask", "level": "sequence", "upper": 2.0},
    "mask_geometric": {"mode": "mask", "level": "geometric", "lower": 0.9, "upper": 1.1},
    "offpolicy_sequence_mask": {"mode": "truncate", "level": "token", "upper": 2.0, "offpolicy_kl": 0.0},
}
METHODS = {"grpo": "lit_rlhf.modules.GRPOModule", "gspo": "lit_rlhf.modules.GSPOModule",
           "rloo": "lit_rlhf.modules.RLOOModule"}
STATS = ("kl_k1", "kl_k3", "masked_fraction", "ratio_min", "ratio_max")


def correction_config(method: str, mode: str, model: str, rollout: dict, path) -> str:
    """A one-step fit's YAML: `method` on 2 arithmetic questions x 2 answers of 4 tokens, the
    `rollout` source given the correction `mode`; returns the file."""
    rollout = {"class_path": rollout["class_path"],
               "init_args": dict(rollout.get("init_args", {}), correction=MODES[mode])}
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "precision": "32", "max_steps": 1, "log_every_n_steps": 1,
                    "limit_val_batches": 0, "num_sanity_val_steps": 0, "enable_checkpointing": False,
                    "enable_progress_bar": False, "enable_model_summary": False, "logger": False},
        "model": {"class_path": METHODS[method], "init_args": {
            "model": model, "dtype": "float32", "reward_fns": [{"class_path": "lit_rlhf.rewards.MathAnswerReward"}],
            "num_generations": 2, "max_new_tokens": 4, "lr": 1.0e-3, "log_completions_every_n_steps": 0,
            "rollout": rollout}},
        "data": {"class_path": "lit_rlhf.data.QADataModule", "init_args": {"path": "bundled:arithmetic", "batch_size": 2,
                                                                           "limit": 4}},
    }
    file = path / f"{method}_{mode}.yaml"
    file.write_text(yaml.safe_dump(config))
    return str(file)


def check_fit(cli, mode: str) -> None:
    """The source holds the YAML's correction, one step ran, and the mismatch statistics are finite."""
    assert cli.model.rollout_source.correction == RolloutCorrection(**MODES[mode])
    assert cli.trainer.global_step == 1
    metrics = cli.trainer.callback_metrics
    for name in STATS:
        value = float(metrics[f"train/rollout_correction/{name}"])
        assert math.isfinite(value), (name, value)
    assert 0.0 <= float(metrics["train/rollout_correction/masked_fraction"]) <= 1.0


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("method", list(METHODS))
def test_every_correction_mode_fits_on_async_rollouts_through_the_cli(tmp_path, method, mode):
    source = {"class_path": "lit_rlhf.online.AsyncRollouts", "init_args": {"max_staleness": 1}}
    cli = main(["--config", correction_config(method, mode, "tiny-random-llama", source, tmp_path)], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    check_fit(cli, mode)
