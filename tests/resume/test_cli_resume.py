"""`python main.py fit --config ... --ckpt_path last` as a job script runs it: the first submission
(no checkpoint yet), a SIGTERM, the resubmission of the same command. The run directory stays the
same (the logger's newest `version_N`), a preempted run exits with 75, the resumed run ends where
the straight run does, bitwise, with a single `last.ckpt`. The config lists no
PreemptionCheckpoint: the checkpoint on SIGTERM is the CLI's default (`lit_rlhf.preemption`)."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys

import pytest
import torch

from callbacks import default_callbacks
from lit_rlhf.cli import main, run
from tests.helpers import REPO_ROOT, subprocess_env, write_config
from tests.resume.harness import checkpoint_values


def config(root, *, signal_marker=None):
    callbacks = [  # no PreemptionCheckpoint listed: every CLI run has one by default
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",  # no dirpath: inside the logger's version_N
         "init_args": {"save_last": True, "every_n_train_steps": 1000}},
    ]
    if signal_marker:
        callbacks.append({"class_path": "tests.helpers.SignalOnce", "init_args": {"marker": str(signal_marker), "step": 2}})
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "precision": "32", "max_steps": 4, "log_every_n_steps": 1,
            "enable_progress_bar": False, "enable_model_summary": False, "limit_val_batches": 0,
            "deterministic": True,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                       "init_args": {"save_dir": str(root / "outputs"), "name": "sft"}},
            "callbacks": callbacks,
        },
        "model": {"class_path": "lit_rlhf.modules.SFTModule",
                  "init_args": {"model": "tiny-random-llama", "lr": 1e-3, "lr_scheduler": "cosine"}},
        "data": {"class_path": "lit_rlhf.data.TLDRSFTDataModule",
                 "init_args": {"path": "bundled:tldr_sft", "max_prompt_length": 96, "max_completion_length": 64,
                               "batch_size": 2, "limit": 6, "val_split": None, "test_split": None}},
    }


def run_cli(*args):
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "main.py", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_preempted_job_resubmitted_with_the_same_command(tmp_path, one_thread):
    cfg = write_config(tmp_path / "sft.yaml", config(tmp_path, signal_marker=tmp_path / "signalled"))
    command = ["fit", "--config", str(cfg), "--ckpt_path", "last", "--fresh_if_no_checkpoint", "true"]

    first = run_cli(*command)
    out = first.stdout + first.stderr
    assert first.returncode == 75, out[-3000:]
    assert "exiting with code 75" in out and "no last checkpoint" in out, out[-3000:]
    run_dir = tmp_path / "outputs" / "sft" / "version_0"
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3
    logged = train_scalars(run_dir / "metrics.csv")  # CSVLogger starts its file afresh on a resume: keep these

    second = run_cli(*command)  # the resubmission: same command, same run directory
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert "continuing the run in" in out and "run stopped: max_steps=4 reached" in out, out[-3000:]
    assert sorted(p.name for p in (tmp_path / "outputs" / "sft").iterdir()) == ["version_0"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt"]  # one last.ckpt, the newest

    # the straight run (in process, same config without the signal) ends with the same checkpoint
    straight = tmp_path / "straight"
    straight.mkdir()
    main(["fit", "--config", str(write_config(straight / "sft.yaml", config(straight)))],
         default_callbacks=default_callbacks)  # what main.py runs
    a = checkpoint_values(straight / "outputs" / "sft" / "version_0" / "checkpoints" / "last.ckpt")
    b = checkpoint_values(run_dir / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and a["global_step"] == 4
    assert not [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]
    # every logged train scalar of every step, as the logger wrote it (epoch and step numbers too)
    logged.update(train_scalars(run_dir / "metrics.csv"))
    assert logged == train_scalars(straight / "outputs" / "sft" / "version_0" / "metrics.csv")
    assert sorted(logged) == [1, 2, 3, 4]  # written at the optimizer steps done (lit_rlhf.training.step_logging)


def train_scalars(path) -> dict[int, dict[str, str]]:
    """{step: {column: value}} of a CSVLogger file, wall-clock columns aside."""
    rows = list(csv.DictReader(open(path)))
    return {int(r["step"]): {k: v for k, v in r.items() if v and "perf/" not in k} for r in rows}


def test_ckpt_path_last_without_a_checkpoint_is_a_project_error(tmp_path, capsys):
    """Exit code 2 and one `error:` line naming the checkpoint directory once (the config has two
    ModelCheckpoints writing to the same directory, as the quickstart recipes do)."""
    cfg = config(tmp_path)
    cfg["trainer"]["callbacks"].append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                        "init_args": {"filename": "best", "save_weights_only": True}})
    with pytest.raises(SystemExit) as stop:
        run(["fit", "--config", str(write_config(tmp_path / "sft.yaml", cfg)), "--ckpt_path", "last"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: --ckpt_path last, but there is no last checkpoint in ") and len(err) == 2, err
    directory = str(tmp_path / "outputs" / "sft" / "version_0" / "checkpoints")
    assert err[0].count(directory) == 1 and "--fresh_if_no_checkpoint true" in err[0], err
    assert not list(tmp_path.glob("outputs/sft/version_*/checkpoints/*.ckpt"))


def test_sigterm_while_the_cli_builds_the_run_exits_75(tmp_path):
    cfg = config(tmp_path)
    cfg["trainer"]["callbacks"].append({"class_path": "tests.helpers.SignalAtInit"})
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(write_config(tmp_path / "sft.yaml", cfg))])
    assert stop.value.code == 75 and "during start-up" in str(stop.value)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the start-up handler is gone afterwards


def test_sigterm_after_the_last_step_lets_the_run_finish_and_exit_0(tmp_path):
    """A SIGTERM after the run's last step (once `run stopped:` is logged, before the loggers' final
    flush) and another as the process exits: the run winds down, writes its logs and exits with 0."""
    cfg = config(tmp_path)
    cfg["trainer"]["callbacks"].append({"class_path": "tests.helpers.SignalAfterFit"})
    done = run_cli("fit", "--config", str(write_config(tmp_path / "sft.yaml", cfg)))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    late = "SIGTERM after the run's last step: the run is complete"
    assert out.count(late) == 2 and out.index("run stopped: max_steps=4 reached") < out.index(late), out[-3000:]
    # the CSV logger writes its file in its final flush, after the first signal
    assert sorted(train_scalars(tmp_path / "outputs" / "sft" / "version_0" / "metrics.csv")) == [1, 2, 3, 4]
