"""Mistakes on the command line or in a config: one `error:` line naming the option, where it was
given and the closest valid names, exit code 2 (`lit_rlhf.cli_errors`), never the usage wall
or a traceback; a model path that a recipe has not written yet says so (`lit_rlhf.models.recipes`)."""

from __future__ import annotations

import pytest
import yaml

from lit_rlhf import cli
from tests.helpers import REPO_ROOT, write_config

QUICK = REPO_ROOT / "configs" / "quickstart"
TINY = "--model.init_args.model=tiny-random-llama"

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run_lines(capsys, *args) -> list[str]:
    """stderr lines of `python main.py <args>` run in process; it must exit with code 2."""
    with pytest.raises(SystemExit) as stop:
        cli.run(list(args))
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2, err
    assert len(err) <= 3 and err[0].startswith("error: "), err
    assert not [line for line in err if "Traceback" in line or "usage:" in line or "Union" in line], err
    return err


def test_misspelled_module_argument_on_the_command_line(capsys):
    err = run_lines(capsys, "fit", "--config", str(QUICK / "sft.yaml"), "--model.init_args.learnig_rate", "1e-3")
    assert err[0].startswith("error: model.init_args.learnig_rate (command line) is not an argument of "
                             "lit_rlhf.modules.SFTModule; did you mean model.init_args.lr"), err


def test_misspelled_trainer_option_in_the_yaml_names_the_file_and_line(tmp_path, capsys):
    config = yaml.safe_load((QUICK / "sft.yaml").read_text())
    config["trainer"]["max_epoch"] = config["trainer"].pop("max_epochs")
    path = write_config(tmp_path / "typo.yaml", config)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "max_epoch:" in text)
    err = run_lines(capsys, "fit", "--config", str(path))
    assert err[0].startswith(f"error: trainer.max_epoch ({path}, line {line}) is not an option of `fit`; "
                             "did you mean trainer.max_epochs"), err


def test_misspelled_callback_argument_and_top_level_key(tmp_path, capsys):
    config = yaml.safe_load((QUICK / "sft.yaml").read_text())
    checkpoint = config["trainer"]["callbacks"][0]["init_args"]
    checkpoint["save_lats"] = checkpoint.pop("save_last")
    err = run_lines(capsys, "fit", "--config", str(write_config(tmp_path / "cb.yaml", config)))
    assert "save_lats" in err[0] and "lightning.pytorch.callbacks.ModelCheckpoint" in err[0], err
    assert "did you mean save_last" in err[0], err
    err = run_lines(capsys, "fit", "--config", str(QUICK / "sft.yaml"), "--ckpt_pth", "last")
    assert err[0].startswith("error: ckpt_pth (command line) is not an option of `fit`; did you mean ckpt_path"), err


def test_a_value_the_trainer_refuses_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = run_lines(capsys, "fit", "--config", str(QUICK / "sft.yaml"), TINY, "--trainer.max_steps", "-5")
    assert err[0].startswith("error: trainer: `max_steps` must be a non-negative integer or -1"), err


def test_ppo_before_the_reward_recipe_names_the_missing_path_and_its_recipe(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no outputs/quickstart/reward_model here
    err = run_lines(capsys, "fit", "--config", str(QUICK / "ppo.yaml"), TINY)
    assert err[0] == (f"error: model path 'outputs/quickstart/reward_model' does not exist (relative to {tmp_path}); it "
                      "is written by `python main.py fit --config configs/quickstart/reward.yaml` (its export_dir): "
                      "run that recipe first"), err
    assert "hub" not in err[0]
