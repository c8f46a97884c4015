"""PPO-ptx: PPO with a language-modelling loss on SFT rows mixed into every update (InstructGPT)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rlhf.data.stream import BatchStream
from lit_rlhf.losses import ptx_loss
from lit_rlhf.training.base import CHECKPOINT_KEY
from lit_rlhf.modules.ppo import PPOModule
from lit_rlhf.online.update import StepLoss
from lit_rlhf.types import PackedSFTBatch, SFTBatch, unpack


class PPOPtxModule(PPOModule):
    """PPO-ptx (Ouyang et al. 2022, "Training language models to follow instructions with human
    feedback", eq. 2; `lit_rlhf.losses.ptx`): every optimizer step of PPO also descends
    `ptx_coef` times the token-mean NLL of a batch of SFT rows, so that the policy keeps
    modelling the SFT text while PPO raises the reward.

    InstructGPT mixes in pretraining text, every token scored; here the language-modelling rows
    are an SFT split and, as in SFT, only their completion tokens (EOS included, D3) are scored,
    at temperature 1 (the policy's own distribution, whatever PPO's `logprob_temperature`).

    The SFT rows are a second data stream inside the module (`lit_rlhf.data.stream`): the
    `ptx_data` DataModule's train split read in passes, each a new permutation drawn from that
    DataModule's `seed`; each optimizer step takes the stream's next batch of its `batch_size`
    rows (on each rank its own). The batch counter (`ptx_batches`) is saved in checkpoints, so a
    resumed run reads the same rows. A step's SFT batch is split over the step's micro-batches
    (`micro_batch_size`) and its NLL normalised by the batch's tokens, so the gradient does not
    depend on the micro-batching; under data parallelism the term is the ranks' mean of their
    token means. It joins the backward pass of the policy loss (`run_updates`: `step_loss`).

    Logs the `PPOModule` stats plus `loss/ptx`: the token-mean NLL of the steps' SFT rows (the
    term added to the loss is `ptx_coef` times it; `loss/total` stays the PPO loss).

    Args:
        ptx_data: the SFT rows, as the `data:` section of an SFT recipe: `{class_path,
            init_args}` of a DataModule yielding `SFTBatch` (packed batches are unpacked), e.g.
            `lit_rlhf.data.TLDRSFTDataModule` (`configs/tldr/sft.yaml`). Its `path` (and
            `data_files`) and `train_split` name the rows; its `batch_size` is the SFT rows of
            each optimizer step (per rank); its `seed` orders the stream; its length limits and
            `on_bad_rows` apply as in SFT. The rows are tokenized with the policy's tokenizer
            (leave `tokenizer` out); its other splits are not read.
        ptx_coef: gamma of eq. 2, the weight of the NLL against the PPO loss (>= 0; 0 trains
            plain PPO). InstructGPT's 27.8 belongs to its GPT-3 models, pretraining data and loss
            normalisation; the default 1 weighs a token's NLL like a token's policy loss.
        **kwargs: `PPOModule` (value model, KL, GAE, clipping, epochs, minibatches), `OnlineModule`
            (reward sources, sampling, micro_batch_size, ...) and `PolicyModule`.
    """

    def __init__(self, ptx_data: dict[str, Any], ptx_coef: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not ptx_coef >= 0:
            raise ValueError(f"ptx_coef must be >= 0, got {ptx_coef}")
        self.ptx_coef = ptx_coef
        self.ptx_stream = BatchStream.from_spec(ptx_data, self.tokenizer, "ptx_data")
        self.ptx_batches = 0  # SFT batches each rank drew from the stream; saved in checkpoints

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        problems, dm = super().check_config(trainer, datamodule), self.ptx_stream.datamodule
        batch_type = dm.batch_type("train") if hasattr(dm, "batch_type") else None
        if batch_type not in (None, SFTBatch, PackedSFTBatch):
            problems.append(f"ptx_data: {type(dm).__name__} yields {batch_type.__name__}; PPO-ptx needs SFT rows "
                            "(SFTBatch), e.g. lit_rlhf.data.TLDRSFTDataModule")
        return problems

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit":  # the SFT rows read and tokenized (bad rows handled) before the first step
            self.ptx_stream.prepare()

    def step_loss(self) -> StepLoss:
        """Each optimizer step: the stream's next SFT batch, its NLL shared out over the micro-batches."""
        trainer = self.trainer
        batch = self.ptx_stream.batch(self.ptx_batches, trainer.global_rank, max(1, trainer.world_size))
        self.ptx_batches += 1
        if isinstance(batch, PackedSFTBatch):
            batch = unpack(batch, self.tokenizer.pad_token_id)
        batch = batch.to(self.device)
        tokens = batch.loss_mask.sum()  # the step's NLL is a token mean over the whole SFT batch

        def share(micro: int, micros: int) -> tuple[Tensor, dict[str, Tensor]]:
            rows = torch.tensor_split(torch.arange(batch.input_ids.shape[0], device=self.device), micros)[micro]
            if rows.numel() == 0:  # more micro-batches than SFT rows: this one has none
                zero = torch.zeros((), device=self.device)
                return zero, {"loss/ptx": zero}
            logps = self.policy_logps(batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows])  # (n, T)
            out = ptx_loss(logps, batch.loss_mask[rows], self.ptx_coef, tokens)
            return out.loss, {"loss/ptx": out.nll * micros}  # averaged over the micro-batches: the step's NLL

        return share

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[CHECKPOINT_KEY]["ptx_batches"] = self.ptx_batches

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.ptx_batches = int(checkpoint.get(CHECKPOINT_KEY, {}).get("ptx_batches", 0))
