"""The LightningCLI behind `main.py`: any module x any DataModule from YAML configs.

    python main.py fit --config configs/tldr/sft.yaml
    python main.py fit --config configs/tldr/dpo.yaml --config configs/strategy/ddp.yaml
    python main.py fit --config configs/tldr/sft.yaml --ckpt_path last      # resume
    python main.py fit --config configs/tldr/sft.yaml --print_config        # resolved config

The DataModule's `tokenizer` is linked to the module's tokenizer (or its model when the module
sets none), so a config names the model once.
"""

from __future__ import annotations

import os
from typing import Any

from lightning import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI


def tokenizer_of(model: str, tokenizer: str | None) -> str:
    return tokenizer or model


class RLHFCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments(
            ("model.init_args.model", "model.init_args.tokenizer"),
            "data.init_args.tokenizer",
            compute_fn=tokenizer_of,
        )


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
