"""The LightningCLI behind `main.py`: any module x any DataModule from YAML configs.

    python main.py fit --config configs/tldr/sft.yaml
    python main.py fit --config configs/tldr/dpo.yaml --config configs/strategy/ddp.yaml
    python main.py fit --config configs/tldr/sft.yaml --ckpt_path last      # resume (lit_rlhf.resume)
    python main.py fit --config configs/tldr/sft.yaml --print_config        # resolved config

The DataModule's `tokenizer` is linked to the module's tokenizer (or its model when the module
sets none), so a config names the model once.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from lightning import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from lit_rlhf import resume

log = logging.getLogger(__name__)


def tokenizer_of(model: str, tokenizer: str | None) -> str:
    return tokenizer or model


class RLHFCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments(
            ("model.init_args.model", "model.init_args.tokenizer"),
            "data.init_args.tokenizer",
            compute_fn=tokenizer_of,
        )
        resume.add_resume_arguments(parser)

    def before_fit(self) -> None:
        resume.end_startup_handler(self.trainer)
        resume.prepare_fit(self.trainer, self.config_init[self.subcommand])

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except SystemExit as exception:  # a preempted fit exits with 75 (lit_rlhf.resume)
            preempted = resume.preempted_exit(getattr(self, "trainer", None), exception)
            if preempted is None:
                raise
            log.warning("run stopped: %s", preempted)
            raise preempted from None


@resume.sigterm_exits_during_startup()  # SIGTERM before the trainer runs: exit 75 at once
def main(args: list[str] | None = None, run: bool = True, **kwargs: Any) -> RLHFCLI:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return RLHFCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,  # every module configures its own optimiser from its init args
        args=args,
        run=run,
        **kwargs,
    )
