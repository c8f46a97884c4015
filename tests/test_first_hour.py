"""A new user's first hour: the promises of "Every method in one command" (README, docs/getting-started.md).

- every method has a quickstart recipe that runs as written: here each runs in-process in a
  fresh directory with only the model swapped to the tiny one and the run shortened, and must
  train, validate, print its result line, keep exactly last.ckpt (full state) + best.ckpt
  (weights only) and export its model;
- an offline misconfiguration fails fast (no hub retries) with one message and exit code 2;
- a normal run's console shows the progress bar and the project's lines, not library noise,
  and `--verbose` shows it all again;
- `fit --help` lists the project's classes and `--model.help DPOModule` works;
- dead runs are called out: equal scores, flat groups, a warm-up longer than the run.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
import yaml

from callbacks import default_callbacks
from callbacks.progress import CompactProgressBar, short_name
from callbacks.run_health import RunHealthCallback
from lit_rlhf import cli
from lit_rlhf.cli import project_error
from lit_rlhf.types import Rollout
from tests.helpers import REPO_ROOT, subprocess_env, write_config

QUICK = REPO_ROOT / "configs" / "quickstart"
METHODS = ("sft", "reward", "dpo", "kto", "drov", "ppo", "grpo",
           "remax", "online_dpo", "rejection_sampling", "orpo", "ppo_ptx", "xpo", "listwise_dpo")
TINY = "--model.init_args.model=tiny-random-llama"
VALIDATE_EACH_STEP = ["--trainer.val_check_interval=1", "--trainer.limit_val_batches=1"]
# the only overrides besides the model: shortening (reward and grpo: tests/test_quickstart.py)
SHORT = {
    "sft": ["--trainer.max_steps=2", *VALIDATE_EACH_STEP],
    "dpo": ["--trainer.max_steps=2", *VALIDATE_EACH_STEP],
    "kto": ["--trainer.max_steps=2", *VALIDATE_EACH_STEP],
    "drov": ["--trainer.max_steps=2", *VALIDATE_EACH_STEP],
    "listwise_dpo": ["--trainer.max_steps=2", *VALIDATE_EACH_STEP],
    "ppo": ["--model.init_args.total_episodes=8", "--model.init_args.max_new_tokens=6", *VALIDATE_EACH_STEP,
            "--data.init_args.max_prompt_length=512"],  # a chat post is ~330 of the tiny tokenizer's byte tokens
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def main(args, **kwargs):
    """What `python main.py` runs, in process: the CLI with the console's default callbacks."""
    return cli.main(args, default_callbacks=default_callbacks, **kwargs)


def test_every_method_has_a_quickstart_recipe_on_the_embedded_model_and_bundled_data():
    readme = (REPO_ROOT / "README.md").read_text()
    for method in METHODS:
        path = QUICK / f"{method}.yaml"
        config = yaml.safe_load(path.read_text())
        assert config["model"]["init_args"]["model"] == "smollm2-135m-instruct", path
        assert config["data"]["init_args"]["path"].startswith("bundled:"), path
        assert config["trainer"]["accelerator"] == "cpu" and str(config["trainer"]["precision"]) == "32", path
        assert f"python main.py fit --config configs/quickstart/{method}.yaml" in readme, method


@pytest.mark.parametrize("method", sorted(SHORT))
def test_quickstart_recipe_runs_as_written(method, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # the recipes write under ./outputs/quickstart
    out = tmp_path / "outputs" / "quickstart"
    if method == "ppo":  # what `fit --config configs/quickstart/reward.yaml` exports
        from lit_rlhf.modules import RewardModule

        RewardModule(model="tiny-random-llama").export_hf(out / "reward_model")
    with caplog.at_level(logging.INFO, logger="callbacks"):
        cli = main(["fit", "--config", str(QUICK / f"{method}.yaml"), TINY, *SHORT[method]])

    assert (out / f"{method}_model" / "config.json").is_file()
    checkpoints = out / method / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt"]
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)
    best = torch.load(checkpoints / "best.ckpt", map_location="cpu", weights_only=False)
    assert "optimizer_states" in last and "optimizer_states" not in best  # full state vs weights only
    assert "validation (first -> last):" in caplog.text  # the run prints its result

    bar = cli.trainer.progress_bar_callback
    assert isinstance(bar, CompactProgressBar)  # added by main.py's defaults: the recipes list none
    if method == "ppo":  # one bar over the run, counting rollouts to the true total
        module = cli.model
        assert bar.train_progress_bar.total == math.ceil(8 / module.episodes_per_rollout()) == module.rollouts
        assert bar.train_progress_bar.n == module.rollouts
        assert bar.train_progress_bar.desc.startswith("rollouts")


def test_bundled_data_aliases_are_listed_in_the_docs():
    from lit_rlhf.data import bundled_aliases

    page = (REPO_ROOT / "docs" / "guides" / "data.md").read_text()
    for alias in bundled_aliases():
        assert f"bundled:{alias}" in page, alias


# ------------------------------------------------------------------------------------------
# offline
# ------------------------------------------------------------------------------------------


def test_offline_misconfiguration_fails_fast_with_one_message(tmp_path):
    """A shipped GPU recipe names a hub model; offline it fails at once, without hub retries,
    with the project's message and exit code 2 instead of a traceback / union dump."""
    done = subprocess.run([sys.executable, str(REPO_ROOT / "main.py"), "fit", "--config",
                           str(REPO_ROOT / "configs" / "tldr" / "sft.yaml")],
                          cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-4000:]
    err = done.stderr
    assert "Traceback" not in err and "Union" not in err and "Retrying" not in err, err
    assert err.startswith("error: could not load model 'EleutherAI/pythia-1b-deduped': offline mode is set"), err
    assert "local directory" in err and "smollm2-135m-instruct" in err


def test_offline_mode_fails_a_hub_name_within_seconds():
    """The time from the lookup to the error (the process start-up, imports, is not counted)."""
    from lit_rlhf import models

    started = time.monotonic()
    with pytest.raises(models.ModelNotFoundError, match="offline mode is set"):
        models.load_causal_lm("EleutherAI/pythia-1b-deduped")
    assert time.monotonic() - started < 5


def test_unreachable_hub_switches_offline_mode_on_before_any_retry(monkeypatch):
    from huggingface_hub import constants

    from lit_rlhf import hub, models

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)  # restored after
    monkeypatch.setattr(hub, "_checked", False)
    monkeypatch.setattr(hub, "_probe_failure", None)
    started = time.monotonic()
    with pytest.raises(models.ModelNotFoundError, match="hub is unreachable: 127.0.0.1:9") as info:
        models.load_tokenizer("nobody/no-such-model")
    assert time.monotonic() - started < 5
    assert "offline mode was switched on" in str(info.value)
    assert constants.HF_HUB_OFFLINE is True
    monkeypatch.delenv("HF_HUB_OFFLINE")  # set by the probe; monkeypatch restores the test's value


def test_telemetry_is_off_unless_the_user_set_it(monkeypatch):
    from lit_rlhf import hub

    monkeypatch.delenv("HF_HUB_DISABLE_TELEMETRY", raising=False)
    monkeypatch.setenv("HF_UPDATE_DOWNLOAD_COUNTS", "1")  # the user's explicit choice
    hub.prepare_environment(check_network=False)
    import os

    assert os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1"
    assert os.environ["HF_UPDATE_DOWNLOAD_COUNTS"] == "1"


def test_project_error_is_found_under_the_union_dump():
    from lit_rlhf.models import ModelNotFoundError

    cause = ModelNotFoundError("could not load model 'x'")
    try:
        try:
            raise cause
        except ModelNotFoundError as err:
            raise ValueError("Does not validate against any of the Union subtypes") from err
    except ValueError as wrapped:
        assert project_error(wrapped) is cause
    assert project_error(ValueError("plain")) is None
    try:  # an init argument refused while the config's classes are built
        try:
            raise ValueError("lr must be > 0, got -1.0")
        except ValueError as err:
            raise ValueError("Does not validate against any of the Union subtypes\nSubtypes: [...]") from err
    except ValueError as wrapped:
        assert str(project_error(wrapped)) == "lr must be > 0, got -1.0"


# ------------------------------------------------------------------------------------------
# console and discoverability
# ------------------------------------------------------------------------------------------

NOISE = ("💡 Tip", "GPU available", "Seed set to", "LeafSpec", "module(s) in eval mode",
         "Trying to infer the `batch_size`", "Writing model shards", "Loading weights", "Generating train split",
         "`weights_only` was not set", "Setting accelerator to CPU", "v_num")


def test_quiet_console_shows_the_bar_and_the_project_lines_and_verbose_shows_everything(tmp_path):
    """Also: the bar counts the run's 2 steps (not the epoch's 16 batches), and the warnings and the
    stop lines are lines of their own, never written onto the bar's line (stdout and stderr
    interleaved as a terminal shows them)."""
    args = [sys.executable, str(REPO_ROOT / "main.py"), "fit", "--config", str(QUICK / "sft.yaml"), TINY,
            "--trainer.max_steps=2", *VALIDATE_EACH_STEP]
    runs = {}
    for name, extra in (("quiet", []), ("verbose", ["--verbose"])):
        done = subprocess.run(args + extra, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-4000:]
        runs[name] = done.stdout
    quiet, verbose = runs["quiet"], runs["verbose"]
    assert [n for n in NOISE if n in quiet] == [], quiet
    for line in ("epoch 1/1", "loss=", "validation (first -> last): loss", "exported SFTModule to", "| 2/2 ",
                 "run stopped: max_steps=2 reached (global step 2"):
        assert line in quiet, quiet
    assert "/16 " not in quiet and "max_epochs=1 reached" not in quiet
    for start in ("the learning-rate warm-up", "`Trainer.fit` stopped", "run stopped:"):
        lines = [line.split("\r")[-1] for line in quiet.split("\n") if start in line]
        assert lines and all(line.startswith(start) for line in lines), lines
    for noise in ("💡 Tip", "GPU available", "Seed set to 1"):  # the filters are what removed them
        assert noise in verbose, verbose


def test_help_lists_the_project_classes_and_short_names_work(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    help_text = capsys.readouterr().out
    top = " ".join(help_text.splitlines()[:15])  # before any of Lightning's Trainer options
    assert "--model.help <method>" in top and "GRPOModule" in top and "--data.help" in top, top
    assert "PolicyModule" not in top and "OnlineModule" not in top  # bases, not methods
    ckpt = " ".join(help_text[help_text.index("--ckpt_path CKPT_PATH\n"):].split())
    assert "`last`: this run's last.ckpt" in ckpt and "--fresh_if_no_checkpoint" in ckpt and "registry" not in ckpt
    for name in ("lit_rlhf.modules.DPOModule", "lit_rlhf.modules.GRPOModule", "lit_rlhf.data.TLDRSFTDataModule",
                 "lit_rlhf.data.UltraFeedbackSingleDataModule"):
        assert name in help_text
    with pytest.raises(SystemExit):
        main(["fit", "--model.help", "DPOModule"])
    assert "--model.beta" in capsys.readouterr().out


def test_short_metric_names():
    assert short_name("train/objective/kl") == "kl"
    assert short_name("val/rewards/accuracies") == "val_acc"
    assert short_name("val/loss") == "val_loss"
    assert short_name("train/loss") == "loss"


# ------------------------------------------------------------------------------------------
# dead runs
# ------------------------------------------------------------------------------------------


def _rollout(scores, has_eos=None):
    scores = torch.tensor(scores, dtype=torch.float32)
    n = scores.shape[0]
    has_eos = torch.zeros(n, dtype=torch.bool) if has_eos is None else torch.tensor(has_eos)
    empty = torch.zeros(n, 1)
    return Rollout(empty.long(), empty.bool(), empty.long(), empty.bool(), has_eos, None, scores=scores)


def test_equal_scores_warn_after_patience_rollouts_once(caplog):
    health = RunHealthCallback(patience=2)
    module = SimpleNamespace(repeats=1)
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        health.on_rollout_end(None, module, _rollout([-1.0, -1.0, -1.0]))
        assert "dead run" not in caplog.text  # one rollout is not yet a pattern
        health.on_rollout_end(None, module, _rollout([-1.0, -1.0, -1.0]))
        health.on_rollout_end(None, module, _rollout([-1.0, -1.0, -1.0]))
    assert caplog.text.count("dead run?") == 1
    assert "same score (-1)" in caplog.text and "0% of the responses ended with EOS" in caplog.text


def test_varied_scores_reset_the_streak(caplog):
    health = RunHealthCallback(patience=2)
    module = SimpleNamespace(repeats=2)
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        for scores in ([1.0, 1.0, 2.0, 2.0], [0.5, 0.7, 1.0, 1.0], [1.0, 1.0, 2.0, 2.0]):
            health.on_rollout_end(None, module, _rollout(scores))
    assert "dead run" not in caplog.text


def test_flat_groups_warn_zero_advantages(caplog):
    health = RunHealthCallback(patience=2)
    module = SimpleNamespace(repeats=2)  # two prompts, two responses each, equal within each group
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        for _ in range(2):
            health.on_rollout_end(None, module, _rollout([1.0, 1.0, 3.0, 3.0]))
    assert "every group-relative advantage is 0" in caplog.text


def test_training_stopped_inside_the_warmup_warns(caplog):
    trainer = SimpleNamespace(lr_scheduler_configs=[SimpleNamespace(scheduler=SimpleNamespace(last_epoch=3))])
    module = SimpleNamespace(hparams={"warmup_steps": 10}, num_training_steps=lambda: 100)
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        RunHealthCallback().on_train_end(trainer, module)
    assert "still inside the 10-step learning-rate warm-up" in caplog.text


def test_warmup_longer_than_the_run_warns_at_start_through_the_cli(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        main(["fit", "--config", str(QUICK / "sft.yaml"), TINY, "--model.init_args.warmup_steps=150",
              "--trainer.max_steps=1", *VALIDATE_EACH_STEP])
    assert "warm-up (150 optimizer steps) is as long as the whole run (1 steps)" in caplog.text


def test_eos_trick_scoring_every_response_alike_is_called_out(tmp_path, monkeypatch, caplog):
    """The issue's dead run: the EOS trick in `replace` mode with responses too short to end."""
    from lit_rlhf.modules import RewardModule

    monkeypatch.chdir(tmp_path)
    RewardModule(model="tiny-random-llama").export_hf(tmp_path / "outputs" / "quickstart" / "reward_model")
    config = yaml.safe_load((QUICK / "grpo.yaml").read_text())
    callbacks = [c for c in config["trainer"]["callbacks"] if c["class_path"] != "callbacks.EOSTrickCallback"]
    config["trainer"]["callbacks"] = [{"class_path": "callbacks.EOSTrickCallback",
                                       "init_args": {"mode": "replace", "score": -1.0}}, *callbacks]
    dead = write_config(tmp_path / "dead.yaml", config)
    with caplog.at_level(logging.WARNING, logger="callbacks.run_health"):
        main(["fit", "--config", str(dead), TINY, "--model.init_args.max_new_tokens=2",
              "--data.init_args.max_prompt_length=512", "--model.init_args.total_episodes=24"])  # byte-level chat posts
    assert "every response of the last 3 rollouts got the same score (-1)" in caplog.text
