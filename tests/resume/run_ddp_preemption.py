"""Per rank (tests/distributed/launch.py): SIGTERM reaches ONE rank of a 2-process DDP fit; every
rank must stop after the same optimizer step with one checkpoint, and the resumed run must end
with the straight run's weights. Writes rank{r}.json.

    python tests/resume/run_ddp_preemption.py --out DIR
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from callbacks import PreemptionCheckpoint  # noqa: E402
from lit_rlhf.data import TLDRSFTDataModule  # noqa: E402
from lit_rlhf.modules import SFTModule  # noqa: E402
from tests.distributed import workloads as W  # noqa: E402


class SignalOneRank(L.Callback):
    """SIGTERM to this process on rank `rank` only, in the backward pass after `step` steps."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step, self.sent = rank, step, False

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


def fit(root: Path, ckpt_path=None, extra=()):
    L.seed_everything(0)
    module = SFTModule(model="tiny-random-llama", lr=1e-3, lr_scheduler="constant")
    dm = TLDRSFTDataModule(path="bundled:tldr_sft", tokenizer="tiny-random-llama", max_prompt_length=96,
                           max_completion_length=64, batch_size=1, limit=6, val_split=None, test_split=None)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=W.make_strategy("ddp"), precision="32-true", max_steps=4,
        logger=False, enable_progress_bar=False, enable_model_summary=False, deterministic=True,
        default_root_dir=str(root), log_every_n_steps=1,
        callbacks=[PreemptionCheckpoint(), *extra,
                   ModelCheckpoint(dirpath=root / "ckpt", save_last=True, every_n_train_steps=1000, save_top_k=0)],
    )
    code = None
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    except SystemExit as stop:
        code = 75 if stop.code is None else stop.code
    return trainer, W.fingerprint(module), code


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank, _ = W.world()
    straight, straight_print, _ = fit(args.out / "straight")
    stopped, _, code = fit(args.out / "split", extra=[SignalOneRank(rank=1, step=2)])
    saved = torch.load(args.out / "split" / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    resumed, resumed_print, resumed_code = fit(args.out / "split", ckpt_path=str(args.out / "split" / "ckpt" / "last.ckpt"))
    W.write_result(args.out, {
        "rank": rank, "stopped_step": stopped.global_step, "code": code, "saved_step": saved,
        "straight_step": straight.global_step, "resumed_step": resumed.global_step, "resumed_code": resumed_code,
        "straight": straight_print, "resumed": resumed_print,
    })


if __name__ == "__main__":
    main()
