"""SIGTERM to a running fit writes a checkpoint; `--ckpt_path last` resumes from it. Every CLI run
has the checkpoint on SIGTERM unless it is turned off (the default run, SIGTERM and exact resume
without it in the config: tests/resume/test_cli_resume.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlhf.cli import main
from lit_rlhf.preemption import PreemptionCheckpoint
from tests.helpers import REPO_ROOT, read_marker, subprocess_env, write_config


def sft_config(tmp_path, max_steps):
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "precision": "32", "max_steps": max_steps, "logger": False,
            "enable_progress_bar": False, "enable_model_summary": False, "default_root_dir": str(tmp_path),
            "limit_val_batches": 0,
            "callbacks": [
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(tmp_path / "ckpts"), "save_last": True, "every_n_train_steps": 10_000}},
                {"class_path": "callbacks.PreemptionCheckpoint"},
                {"class_path": "tests.helpers.StepMarker", "init_args": {"path": str(tmp_path / "marker.json")}},
            ],
        },
        "model": {"class_path": "lit_rlhf.modules.SFTModule",
                  "init_args": {"model": "tiny-random-llama", "lr": 1e-3, "lr_scheduler": "constant"}},
        "data": {"class_path": "lit_rlhf.data.TLDRSFTDataModule",
                 "init_args": {"path": "bundled:tldr_sft", "max_prompt_length": 384, "max_completion_length": 64,
                               "batch_size": 2}},
    }


def test_sigterm_saves_last_checkpoint_and_resume_continues(tmp_path):
    config = write_config(tmp_path / "sft.yaml", sft_config(tmp_path, max_steps=10_000))
    cmd = [sys.executable, "main.py", "fit", "--config", str(config)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while read_marker(tmp_path / "marker.json") < 3:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "training did not start in time"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    last = tmp_path / "ckpts" / "last.ckpt"
    assert last.is_file(), output[-3000:]
    assert proc.returncode == 75 and "exiting with code 75" in output, output[-3000:]  # a requeue script reruns it
    saved = torch.load(last, map_location="cpu", weights_only=False)
    step = saved["global_step"]
    assert 3 <= step < 10_000
    assert read_marker(tmp_path / "marker.json") == step  # nothing ran after the checkpoint

    resume = write_config(tmp_path / "resume.yaml", sft_config(tmp_path, max_steps=step + 2))
    done = subprocess.run([sys.executable, "main.py", "fit", "--config", str(resume), "--ckpt_path", "last"],
                          cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert read_marker(tmp_path / "marker.json") == step + 2


class SignalSelfAfter(L.Callback):
    """Sends SIGTERM to this process from `on_train_batch_end` of step `step`, i.e. AFTER the
    PreemptionCheckpoint's own hook for that batch: the signal is only seen at the next step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_after_the_callbacks_hook_saves_at_the_end_of_the_next_step(tmp_path):
    from tests.modules.test_sft import make_batches

    from callbacks import PreemptionCheckpoint
    from lit_rlhf.modules import SFTModule

    L.seed_everything(0)
    handler_before = signal.getsignal(signal.SIGTERM)
    module = SFTModule(model="tiny-random-llama", lr=1e-3)
    preemption = PreemptionCheckpoint(dirpath=str(tmp_path / "ckpts"))
    trainer = L.Trainer(
        max_steps=50, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path, callbacks=[preemption, SignalSelfAfter(3)],
    )
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException once step 4 is logged
        trainer.fit(module, make_batches(module.tokenizer, batch_size=1))
    saved = torch.load(tmp_path / "ckpts" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == 4 == trainer.global_step
    assert preemption.exit_code == 75 and "exiting with code 75" in preemption.message(trainer)
    for key, value in module.state_dict().items():  # the weights after step 4, nothing later
        assert torch.equal(saved["state_dict"][key], value), key
    # the handler from before the fit is back (Lightning's teardown must not reinstate ours)
    assert signal.getsignal(signal.SIGTERM) == handler_before


class SignalAtTeardown(L.Callback):
    """SIGTERM to this process in the fit's teardown, after `run stopped:`, before the loggers' flush."""

    def teardown(self, trainer, pl_module, stage) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def test_after_a_complete_fit_sigterm_is_ignored_until_the_fit_returns_then_passed_on(tmp_path):
    """In a script (no `hold_until_exit`): a SIGTERM during a complete fit's wind-down is logged and
    ignored; once `trainer.fit` returned, the next goes to the handler from before the fit."""
    from tests.modules.test_sft import make_batches

    from lit_rlhf.modules import SFTModule

    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        module = SFTModule(model="tiny-random-llama", lr=1e-3)
        preemption = PreemptionCheckpoint(dirpath=str(tmp_path / "ckpts"))
        trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=tmp_path,
                            callbacks=[SignalAtTeardown(), preemption])
        trainer.fit(module, make_batches(module.tokenizer, batch_size=1))  # no SystemExit: the run is complete
        assert not received  # the wind-down's signal was not passed on
        assert preemption.finished and preemption.received == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == preemption._on_signal  # held until the fit returned
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) != preemption._on_signal
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------------------
# on by default
# ------------------------------------------------------------------------------------------


def preemption_callbacks(tmp_path, *args, listed=None, checkpointing=True, top_level=None):
    """The PreemptionCheckpoints of the Trainer the CLI builds from `sft_config` (none listed
    unless `listed`) with `args`; `checkpointing=False` sets trainer.enable_checkpointing: false."""
    config = sft_config(tmp_path, max_steps=1)
    callbacks = [c for c in config["trainer"]["callbacks"] if "Preemption" not in c["class_path"]]
    if listed is not None:
        callbacks.append(listed)
    if not checkpointing:
        callbacks = [c for c in callbacks if "ModelCheckpoint" not in c["class_path"]]
        config["trainer"]["enable_checkpointing"] = False
    config["trainer"]["callbacks"] = callbacks
    config.update(top_level or {})
    cli = main(["--config", str(write_config(tmp_path / "run.yaml", config)), *args], run=False)
    return [c for c in cli.trainer.callbacks if isinstance(c, PreemptionCheckpoint)]


def test_every_cli_run_has_a_preemption_checkpoint_unless_turned_off(tmp_path, one_thread):
    assert len(preemption_callbacks(tmp_path)) == 1  # the default
    mine = {"class_path": "callbacks.PreemptionCheckpoint", "init_args": {"dirpath": str(tmp_path / "mine")}}
    assert [c.dirpath for c in preemption_callbacks(tmp_path, listed=mine)] == [str(tmp_path / "mine")]  # replaces it
    assert preemption_callbacks(tmp_path, "--preemption_checkpoint", "false") == []
    assert preemption_callbacks(tmp_path, top_level={"preemption_checkpoint": False}) == []  # in the YAML
    assert preemption_callbacks(tmp_path, checkpointing=False) == []  # trainer.enable_checkpointing: false


def shipped_recipes() -> list[Path]:
    """The method recipes (overlays such as configs/strategy/*.yaml name no model)."""
    return sorted(p for p in (REPO_ROOT / "configs").rglob("*.yaml") if (yaml.safe_load(p.read_text()) or {}).get("model"))


@pytest.mark.parametrize("recipe", shipped_recipes(), ids=lambda p: str(p.relative_to(REPO_ROOT / "configs")))
def test_every_shipped_recipe_writes_last_ckpt_where_ckpt_path_last_looks(recipe):
    """SIGTERM to any shipped recipe leaves `last.ckpt` in the directory of its ModelCheckpoint
    that keeps `last.ckpt` (what `--ckpt_path last` searches): nothing turns the default off."""
    from lit_rlhf.cli import default_callbacks

    config = yaml.safe_load(recipe.read_text())
    trainer = config["trainer"]
    listed = trainer.get("callbacks") or []
    assert config.get("preemption_checkpoint", True) is not False
    assert not [c for c in listed if "Preemption" in str(c.get("class_path", ""))]
    added = default_callbacks(trainer, [])
    assert [type(c) for c in added] == [PreemptionCheckpoint], recipe
    checkpoints = [ModelCheckpoint(**(c.get("init_args") or {})) for c in listed
                   if str(c.get("class_path", "")).endswith("ModelCheckpoint")]
    keepers = [c for c in checkpoints if c.save_last]
    assert keepers, f"{recipe}: no ModelCheckpoint with save_last: true"
    fake = SimpleNamespace(checkpoint_callbacks=checkpoints, default_root_dir="root")
    where = added[0].checkpoint_path(fake)
    if keepers[0].dirpath:  # else Lightning puts it in the logger's directory at set-up, and the file with it
        assert where == Path(keepers[0].dirpath) / "last.ckpt", recipe
