"""Reward model training: a causal LM backbone with a scalar head (D11) read at the EOS token
(D12, D14), fitted with Bradley-Terry on preference pairs (docs/methods/reward-models.md).

The export is a directory plain `transformers` loads as `AutoModelForSequenceClassification`.
Its heads have no bias: the head bias is folded exactly into the final LayerNorm's bias where
there is one (GPT-NeoX, GPT-2, OPT); an RMSNorm model (Llama, SmolLM2) stores it in
`config.reward_bias`, which `lit_rlhf.models.load_reward_model` adds back, while plain
transformers returns `reward - reward_bias` (a constant shift, warned at export).
"""

from __future__ import annotations

import inspect
import logging
import math
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from lit_rlhf import checks, models
from lit_rlhf.models import adapters, scalar_adapters
from lit_rlhf.models.shared_prompt import grouped_scalar_scores
from lit_rlhf.losses import bradley_terry_loss
from lit_rlhf.training.base import TrainingModule
from lit_rlhf.training.memory import DEFAULTS, Memory
from lit_rlhf.training.moved import refuse_moved
from lit_rlhf.training.optim import SchedulerName, decay_groups
from lit_rlhf.training.settings import record_settings
from lit_rlhf.training.reward_eval import PairEvaluationMixin
from lit_rlhf.types import ListBatch, PreferenceBatch, split_pair

log = logging.getLogger(__name__)


class RewardModule(PairEvaluationMixin, TrainingModule):
    """Train a scalar reward model on preference pairs (Bradley-Terry, D11, D12, D14, D15, D16, D18).

    Args:
        model: the backbone: a builtin name, a local directory (an SFT checkpoint exported by
            `SFTModule`, or an exported reward model whose head is kept), a `.gguf` file or a hub id.
            A causal LM gets a fresh scalar head with the D11 initialisation.
        tokenizer: tokenizer name; defaults to `model`.
        dtype: dtype the weights are loaded in (`float32`, `bfloat16`, `float16`).
        lr: peak learning rate of AdamW.
        weight_decay: AdamW weight decay (not applied to biases and norm weights).
        adam_eps: AdamW epsilon (the N+ paper uses 1e-5).
        adam_betas: AdamW betas.
        warmup_steps: linear warmup length in optimizer steps; `warmup_ratio` is used when 0.
        warmup_ratio: warmup as a fraction of the total number of optimizer steps.
        lr_scheduler: decay after warmup: `cosine`, `linear` (both to 0) or `constant`.
        export_dir: when set, the reward model is exported there at the end of fit (see module doc).
        use_margin: subtract the data's per-pair margin inside the sigmoid (Llama 2 margin loss);
            the DataModule must fill `PreferenceBatch.margin`, else a clear error is raised.
        center_coef: weight of the centring term `mean((r_c + r_r)^2)` (0 = off).
        group_columns: `batch.meta` columns whose values get their own validation accuracy (D16);
            columns absent from the data are skipped.
        calibration_bins: number of reward-difference buckets of the calibration plot (D18).
        score_batch_size: micro-batch size of `score_texts` / `normalize_to` (D15).
        on_nonfinite: what a NaN/inf loss or gradient does before the optimizer step: `error`
            (default) stops with an error naming the step and the batch rows; `skip` skips that
            optimizer step and counts it (`train/guard/skipped_steps`), as in `PolicyModule`.
        lora: train a LoRA adapter (and the head) on the frozen causal LM `model` instead of
            its weights (`lit_rlhf.models.adapters.lora_config` lists the forms). The export
            then also writes the adapter alone to `export_dir/adapter`.
        memory: how compute is traded for memory (`lit_rlhf.training.Memory`): `shared_prompt`
            (default) computes each pair's prompt once; `gradient_checkpointing`,
            `optimizer_in_backward` and `release_host_memory` as for `PolicyModule`;
            `logprob_chunk_size` and `frozen_placement` are a policy's and refused here.

    Validation and test (`lit_rlhf.training.reward_eval`) add accuracy per grouping column (D16)
    and per evaluation split, and calibration (D18). D15 is `normalize_to`.
    """

    batch_types = (PreferenceBatch,)

    def __init__(
        self,
        model: str = models.TINY_RANDOM_LLAMA,
        tokenizer: str | None = None,
        dtype: str = "float32",
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        adam_eps: float = 1e-8,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        warmup_ratio: float = 0.0,
        lr_scheduler: SchedulerName = "cosine",
        export_dir: str | None = None,
        use_margin: bool = False,
        center_coef: float = 0.0,
        group_columns: Sequence[str] = ("batch", "confidence"),
        calibration_bins: int = 10,
        score_batch_size: int = 16,
        on_nonfinite: Literal["error", "skip"] = "error",
        lora: dict[str, Any] | None = None,
        memory: Memory | None = None,
        **moved: Any,
    ) -> None:
        refuse_moved(type(self), moved)
        memory = Memory() if memory is None else memory
        if memory.frozen_placement != DEFAULTS.frozen_placement or memory.logprob_chunk_size != DEFAULTS.logprob_chunk_size:
            raise ValueError("RewardModule: memory.frozen_placement and memory.logprob_chunk_size are a policy's settings "
                             "(a reward model has no frozen models and scores one token per row); leave them unset")
        super().__init__()
        # the resolved tokenizer, as the CLI gives the DataModule (a logger merges both hparams)
        record_settings(self, inspect.currentframe(), tokenizer=tokenizer or model)
        self.set_training_settings(lr=lr, weight_decay=weight_decay, adam_eps=adam_eps, adam_betas=adam_betas,
                                   warmup_steps=warmup_steps, warmup_ratio=warmup_ratio, lr_scheduler=lr_scheduler,
                                   export_dir=export_dir, on_nonfinite=on_nonfinite, memory=memory)
        if center_coef < 0 or score_batch_size < 1:
            raise ValueError(f"center_coef must be >= 0 and score_batch_size >= 1, got {center_coef}, {score_batch_size}")
        self.use_margin, self.center_coef, self.score_batch_size = bool(use_margin), center_coef, score_batch_size
        self.model_name = model
        self.tokenizer_name = tokenizer or model  # the DataModule's tokenizer follows it (`lit_rlhf.cli`)
        self.tokenizer = models.load_tokenizer(self.tokenizer_name)
        self.lora_config = adapters.lora_config(lora)
        if self.lora_config is None:
            self.reward_model = models.load_scalar_model(model, self.tokenizer, dtype)
        else:  # the adapter `reward` on a frozen causal LM base, and a trained head
            self.reward_model, peft_model = scalar_adapters.lora_scalar_model(model, self.tokenizer, dtype, self.lora_config)
            object.__setattr__(self, "reward_peft", peft_model)  # the body is reward_model.backbone
        if self.gradient_checkpointing:
            self.reward_model.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.init_pair_evaluation(group_columns, calibration_bins)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Reward (N,) of each row, read at its last real token (D12), any padding side (D14)."""
        return self.reward_model.score(input_ids, attention_mask)

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """Also: `use_margin` needs PreferenceBatches that carry a margin."""
        problems = super().check_config(trainer, datamodule)
        if (self.use_margin and datamodule is not None and checks.yields(datamodule, "PreferenceBatch")
                and getattr(datamodule, "margin_from", "") is None):
            problems.append(f"{type(self).__name__} has use_margin=true but {type(datamodule).__name__} has no "
                            "margin_from, so its batches carry no margin: set margin_from ('confidence' for TL;DR, "
                            "'score_difference' for UltraFeedback) or use_margin: false")
        return problems

    def pair_rewards(self, batch: PreferenceBatch) -> tuple[Tensor, Tensor]:
        """(chosen, rejected) rewards, (B,) each in float32, from one forward over the 2B rows."""
        if not isinstance(batch, PreferenceBatch):
            raise TypeError(f"RewardModule needs a PreferenceBatch, got {type(batch).__name__}")
        return split_pair(self.row_rewards(batch))  # (B,), (B,)

    def row_rewards(self, batch: PreferenceBatch | ListBatch) -> Tensor:
        """Float32 rewards of the batch's rows, each shared prompt computed once under `shared_prompt`."""
        if self.shared_prompt:
            return grouped_scalar_scores(self.reward_model, batch.input_ids, batch.attention_mask, batch.sharing).float()
        return self(batch.input_ids, batch.attention_mask).float()

    def _loss(self, batch: PreferenceBatch):
        chosen, rejected = self.pair_rewards(batch)  # (B,), (B,)
        if self.use_margin and batch.margin is None:
            raise ValueError("use_margin=True but the PreferenceBatch has no margin: set the DataModule's `margin_from` "
                             "(TL;DR: 'confidence'; UltraFeedback: the score difference), or set use_margin=False")
        margin = batch.margin.float() if self.use_margin else None  # (B,)
        return bradley_terry_loss(chosen, rejected, margin, self.center_coef), chosen, rejected

    def training_step(self, batch: PreferenceBatch, batch_idx: int) -> Tensor | None:
        out, _, _ = self._loss(batch)
        if not self.check_finite(batch, loss=out.loss):
            return None  # on_nonfinite=skip: Lightning skips backward and the step
        stats = {
            "loss": out.loss.detach(),
            "loss/ranking": out.ranking_loss,
            "rewards/accuracy": out.accuracy,
            "rewards/chosen": out.chosen_mean,
            "rewards/rejected": out.rejected_mean,
            "rewards/margins": out.margin_mean,
        }
        if self.center_coef:
            stats["loss/center"] = out.center_loss
        self.log_stats("train", stats, prog_bar=("loss", "rewards/accuracy"), batch_size=batch.num_pairs)
        return out.loss

    @torch.no_grad()
    def score_texts(self, prompts: Sequence[str], completions: Sequence[str], batch_size: int | None = None,
                    chat: bool = False) -> Tensor:
        """Rewards (N,) of `prompt + completion + EOS` texts, tokenised as the DataModules do
        (`encode_prompt`, `chat=True` for chat-templated text; `encode_completion`, D3: a TL;DR
        completion carries its leading space). Under DDP each process scores an equal share."""
        from lit_rlhf.data.formatting import encode_completion, encode_prompt

        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if not prompts:
            raise ValueError("no reference texts to score")
        size = batch_size or self.score_batch_size
        trainer = self.attached_trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        per_rank = math.ceil(len(prompts) / world)
        indices = [(rank + world * i) % len(prompts) for i in range(per_rank)]  # strided share, padded by wrap-around
        pad = self.tokenizer.pad_token_id
        was_training = self.reward_model.training
        self.reward_model.eval()
        local = []
        for start in range(0, per_rank, size):
            rows = [torch.as_tensor(encode_prompt(self.tokenizer, prompts[i], chat=chat)
                                    + encode_completion(self.tokenizer, completions[i])) for i in indices[start:start + size]]
            ids = pad_sequence(rows, batch_first=True, padding_value=pad)  # right padded
            mask = pad_sequence([torch.ones(len(r), dtype=torch.bool) for r in rows], batch_first=True)
            local.append(self(ids.to(self.device), mask.to(self.device)).float())
        self.reward_model.train(was_training)
        rewards = torch.cat(local)  # (per_rank,)
        if world > 1:
            gathered = self.all_gather(rewards)  # (world, per_rank)
            rewards = gathered.transpose(0, 1).reshape(-1)[: len(prompts)]  # back to the original order
        return rewards

    @torch.no_grad()
    def normalize_to(self, prompts: Sequence[str], completions: Sequence[str], batch_size: int | None = None,
                     chat: bool = False) -> tuple[float, float]:
        """D15: shift the head bias so the mean reward of these reference responses is 0. Returns
        (mean before, mean after); the reward is linear in the bias, so the latter is not re-scored."""
        rewards = self.score_texts(prompts, completions, batch_size, chat)
        before = float(rewards.double().mean())
        head = self.reward_model.head
        if head.bias is None:
            raise ValueError("the reward head has no bias: D15 normalisation needs one")
        head.bias.sub_(before)
        after = float((rewards.double() - before).mean())
        log.info("D15 reward normalisation on %d reference responses: mean %.6f -> %.6f (head bias %.6f)",
                 len(prompts), before, after, float(head.bias.detach()))
        return before, after

    def optimizer_param_groups(self) -> list[dict[str, Any]]:
        return decay_groups(self.reward_model, self.weight_decay)

    def export_hf(self, directory: str | Path) -> Path:
        """Write an `AutoModelForSequenceClassification` (num_labels=1) and the tokenizer (the head
        bias: module docstring); `lit_rlhf.models.load_reward_model(directory)` loads it back. With
        LoRA the adapter is merged, and also written alone to `directory/adapter`, which online
        methods with LoRA on the same base take as `reward_model`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        scalar = self.reward_model
        if self.lora_config is not None:  # merged for plain transformers; the adapter alone in adapter/
            adapters.save_adapter(self.reward_peft, directory / "adapter", adapters.REWARD, base_name=self.model_name)
            scalar_adapters.save_head(self.reward_model.head, directory / "adapter")
            merged = adapters.merged_copy(self.reward_peft, adapters.REWARD)
            scalar = models.ScalarHeadModel(models.backbone_of(merged), self.reward_model.head)
        classifier, folded = models.to_sequence_classifier(scalar, self.tokenizer.pad_token_id)
        bias = float(self.reward_model.head.bias.detach())
        if not folded and bias != 0.0:
            log.warning(
                "exporting a reward model whose final norm has no bias to fold the head bias %.6g into: it is stored in "
                "config.reward_bias. lit_rlhf.models.load_reward_model adds it back; plain transformers "
                "AutoModelForSequenceClassification returns reward - %.6g.", bias, bias,
            )
        classifier.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        log.info("exported the reward model to %s (head bias %s)", directory, "folded into the final LayerNorm" if folded
                 else "in config.reward_bias")
        return directory
