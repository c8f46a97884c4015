"""D15 reward normalisation at the end of reward-model training.

After training, the reward model's head bias is shifted so that the reference responses of a
dataset (TL;DR: the human-written `summary` of the SFT set) score 0 on average (N+ paper, D15).
PPO's rewards are then centred on what a human reference earns.

    trainer:
      callbacks:
        - class_path: callbacks.RewardNormalizationCallback
          init_args: {path: vwxyzjn/summarize_from_feedback_tldr_3_filtered, split: train}
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from lightning import Callback, LightningModule, Trainer

log = logging.getLogger(__name__)


class RewardNormalizationCallback(Callback):
    """At the end of fit, set the reward head's bias so reference responses have mean reward 0 (D15).

    The references come from an object with `reference_texts(split) -> (prompts, completions)`
    (the SFT and prompt DataModules of `lit_rlhf.data` have it), found in this order: `datamodule`;
    a DataModule of class `data_class` built from `path` with the module's tokenizer; the trainer's
    own DataModule when it has `reference_texts`. Anything else is a clear error.

    It runs in `on_train_end` (before the module's end-of-fit export, so the export carries the
    new bias) on every process (scoring is sharded under DDP), logs
    `train/normalization/{mean_before,mean_after}` to the trainer's loggers, and, with
    `save_checkpoint`, writes a checkpoint holding the normalised weights next to the
    ModelCheckpoint files (or in `trainer.default_root_dir`). Checkpoints written during training
    hold the un-normalised bias. The statistics are in this callback's `state_dict()`.

    Args:
        path: dataset path/hub id/bundled alias of the reference data (e.g. the TL;DR SFT set).
        datamodule: a ready object with `reference_texts(split)`; takes precedence over `path`.
        data_class: dotted class built as `data_class(path=path, tokenizer=<module tokenizer name>,
            **data_args)`.
        data_args: further constructor arguments of `data_class` (e.g. its split names).
        split: the split whose references are scored.
        limit: score at most this many references (the first ones), None for all.
        batch_size: micro-batch size of the scoring passes (None: the module's `score_batch_size`).
        chat: the prompts are chat-templated text (encoded as is, no BOS added).
        save_checkpoint: write a checkpoint with the normalised weights after normalising.
        checkpoint_name: file name of that checkpoint.
    """

    # read by the start-up checks (`lit_rlhf.checks`): without `path` or `datamodule`, the trainer's
    # DataModule must have `reference_texts`
    needs_reference_texts = True

    def __init__(
        self,
        path: str | None = None,
        datamodule: Any = None,
        data_class: str = "lit_rlhf.data.TLDRSFTDataModule",
        data_args: dict[str, Any] | None = None,
        split: str = "train",
        limit: int | None = None,
        batch_size: int | None = None,
        chat: bool = False,
        save_checkpoint: bool = True,
        checkpoint_name: str = "reward-normalized.ckpt",
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        self.path = path
        self.datamodule = datamodule
        self.data_class = data_class
        self.data_args = dict(data_args or {})
        self.split = split
        self.limit = limit
        self.batch_size = batch_size
        self.chat = chat
        self.save_checkpoint = save_checkpoint
        self.checkpoint_name = checkpoint_name
        self.stats: dict[str, float] = {}
        self.checkpoint_path: Path | None = None

    def _source(self, trainer: Trainer, pl_module: LightningModule) -> Any:
        if self.datamodule is not None:
            source = self.datamodule
        elif self.path is not None:
            module_name, _, class_name = self.data_class.rpartition(".")
            cls = getattr(importlib.import_module(module_name), class_name)
            hp = pl_module.hparams
            source = cls(path=self.path, tokenizer=hp.get("tokenizer") or hp.get("model"), **self.data_args)
        else:
            source = getattr(trainer, "datamodule", None)
        if source is None or not callable(getattr(source, "reference_texts", None)):
            raise ValueError(
                "RewardNormalizationCallback needs reference responses: pass `datamodule` (with "
                "reference_texts(split)) or `path` to an SFT dataset; the trainer's DataModule "
                f"({type(source).__name__}) has no reference_texts"
            )
        return source

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not callable(getattr(pl_module, "normalize_to", None)):
            raise TypeError(f"RewardNormalizationCallback needs a RewardModule, got {type(pl_module).__name__}")
        prompts, completions = self._source(trainer, pl_module).reference_texts(self.split)
        prompts, completions = list(prompts), list(completions)
        if self.limit is not None:
            prompts, completions = prompts[: self.limit], completions[: self.limit]
        before, after = pl_module.normalize_to(prompts, completions, batch_size=self.batch_size, chat=self.chat)
        self.stats = {"mean_before": before, "mean_after": after, "num_references": float(len(prompts)),
                      "bias": float(pl_module.reward_model.head.bias.detach())}
        metrics = {"train/normalization/mean_before": before, "train/normalization/mean_after": after}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        log.info("D15: mean reward of %d %r references %.6f -> %.6f", len(prompts), self.split, before, after)
        if self.save_checkpoint:
            dirpath = getattr(trainer.checkpoint_callback, "dirpath", None) or trainer.default_root_dir
            self.checkpoint_path = Path(dirpath) / self.checkpoint_name
            trainer.save_checkpoint(self.checkpoint_path)  # collective under DDP/DeepSpeed: every rank calls it

    def state_dict(self) -> dict[str, Any]:
        return {"stats": dict(self.stats)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stats = dict(state_dict.get("stats", {}))
