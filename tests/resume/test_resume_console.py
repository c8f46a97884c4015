"""What a run resumed inside an epoch shows: no Lightning warning that contradicts the exact resume
("your dataloader is not resumable": the DataModules' ResumableSampler resumes exactly,
`lit_rlhf.resume.exact_resume_warnings`), and a progress bar with its total and ETA
(`callbacks.progress.CompactProgressBar`), not `3/?`."""

from __future__ import annotations

import warnings

import pytest
from lightning.pytorch.callbacks import Callback

from callbacks import default_callbacks
from lit_rlhf.cli import main
from lit_rlhf.resume import NOT_RESUMABLE_WARNING, resumes_mid_epoch_exactly
from tests.helpers import write_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class BarSpy(Callback):
    """Records whether the fit resumed inside an epoch, and the train bar at the end of the fit."""

    def __init__(self) -> None:
        self.mid_epoch = None
        self.bar = None

    def on_train_start(self, trainer, pl_module):
        self.mid_epoch = trainer.fit_loop.restarted_mid_epoch

    def on_train_end(self, trainer, pl_module):
        bar = trainer.progress_bar_callback.train_progress_bar
        self.bar = (bar.total, bar.n, bar.initial)


def config(root, max_steps):
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "precision": "32", "max_steps": max_steps, "logger": False,
            "enable_model_summary": False, "limit_val_batches": 0, "default_root_dir": str(root),
            "callbacks": [
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(root / "ckpts"), "save_last": True, "save_top_k": 0}},
                {"class_path": "tests.resume.test_resume_console.BarSpy"},
            ],
        },
        "model": {"class_path": "lit_rlhf.modules.SFTModule",
                  "init_args": {"model": "tiny-random-llama", "lr": 1e-3, "lr_scheduler": "constant"}},
        "data": {"class_path": "lit_rlhf.data.TLDRSFTDataModule",  # 12 rows, batches of 2: 6 per epoch
                 "init_args": {"path": "bundled:tldr_sft", "max_prompt_length": 384, "max_completion_length": 64,
                               "batch_size": 2, "limit": 12, "val_split": None, "test_split": None}},
    }


def test_resume_inside_an_epoch_warns_nothing_and_keeps_the_bar_total(tmp_path):
    main(["fit", "--config", str(write_config(tmp_path / "first.yaml", config(tmp_path, 2)))],
         default_callbacks=default_callbacks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = main(["fit", "--config", str(write_config(tmp_path / "resume.yaml", config(tmp_path, 4))),
                    "--ckpt_path", "last"], default_callbacks=default_callbacks)
    spy = next(c for c in cli.trainer.callbacks if isinstance(c, BarSpy))
    assert spy.mid_epoch is True and cli.trainer.global_step == 4  # resumed after batch 2 of 6
    assert not [w for w in caught if NOT_RESUMABLE_WARNING in str(w.message)]
    assert spy.bar == (4, 4, 2)  # 4 of this epoch's batches run to max_steps, 2 of them trained before


def test_the_warning_stays_for_a_loader_that_does_not_resume_itself():
    from lit_rlhf.data import TLDRSFTDataModule

    exact = TLDRSFTDataModule("bundled:tldr_sft", "tiny-random-llama", limit=4)
    assert resumes_mid_epoch_exactly(exact)
    assert not resumes_mid_epoch_exactly(TLDRSFTDataModule("bundled:tldr_sft", "tiny-random-llama", limit=4,
                                                           num_workers=2))  # may prefetch before the restore

    class OwnLoader(TLDRSFTDataModule):
        def train_dataloader(self):
            return []

    assert not resumes_mid_epoch_exactly(OwnLoader("bundled:tldr_sft", "tiny-random-llama", limit=4))
    assert not resumes_mid_epoch_exactly(None)
