"""Reward model training: a causal LM backbone with a scalar head, fitted with Bradley-Terry.

The reward model is `lit_rlhf.models.ScalarHeadModel`: the transformer body of a causal LM (or
of an exported reward model) and a linear head initialised N(0, 1/sqrt(d_model + 1)) (D11).
The reward of a sequence is the head's output at its EOS token, the last real token of the
response (D12); position ids come from the attention mask, so left- and right-padded inputs give
the same reward (D14).

A `PreferenceBatch` holds the chosen rows then the rejected rows, so both are scored in one
forward pass; the loss is `lit_rlhf.losses.bradley_terry_loss` (with the data's margin when
`use_margin` is set, and the optional centring term).

Validation (and test) logs, all correct under DDP (torchmetrics states are synced; the metrics
are in `lit_rlhf.modules.reward_metrics`):
- `val/loss`, `val/rewards/{accuracy,chosen,rejected,margins}`;
- accuracy per value of each grouping column of `batch.meta` (TL;DR `batch` and `confidence`,
  N+ D16): scalars `val/accuracy_by_<column>/<value>` and a markdown table in TensorBoard text;
- accuracy per named evaluation split when the batches' meta has an "eval_split" column (the
  TL;DR comparisons' "validation" and "validation_cnndm"): `val/<split>/accuracy`;
- calibration (D18): accuracy against buckets of the reward difference |r_c - r_r|, next to the
  Bradley-Terry prediction sigmoid(|r_c - r_r|); `val/calibration/ece` and a TensorBoard figure.

D15 (reward normalisation) is `normalize_to(prompts, completions)`, run at the end of fit by
`callbacks.RewardNormalizationCallback`: the head bias is shifted so that the reference
responses score 0 on average. The bias is a parameter, so it is in every later checkpoint.

Export (`export_hf`, at the end of fit when `export_dir` is set): a directory that plain
`transformers` loads as `AutoModelForSequenceClassification` (num_labels=1, pad_token_id set).
Transformers' classification heads have no bias, so the head bias is folded exactly into the final
LayerNorm's bias where there is one (GPT-NeoX/Pythia, GPT-2, OPT) and plain transformers gives the
module's rewards. For RMSNorm models (Llama, SmolLM2, Mistral) no exact fold exists: the bias is
written to `config.reward_bias`, which `lit_rlhf.models.load_reward_model` adds back, while
**plain transformers then returns `reward - reward_bias`** (a constant shift; rankings and
pairwise judgements are unchanged). A warning says so at export.
"""

from __future__ import annotations

import inspect
import logging
import math
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from torch import Tensor, nn

from lit_rlhf import checks, models
from lit_rlhf.models import adapters, scalar_adapters
from lit_rlhf.models.shared_prompt import grouped_scalar_scores
from lit_rlhf.losses import bradley_terry_loss
from lit_rlhf.modules.base import TrainingModule
from lit_rlhf.modules.optim import SchedulerName, decay_groups
from lit_rlhf.modules.settings import record_settings
from lit_rlhf.modules.reward_metrics import (
    PreferenceRecords,
    accuracy_table,
    calibration_buckets,
    calibration_figure,
    grouped_accuracy,
    metric_safe,
    pair_metrics,
)
from lit_rlhf.types import PreferenceBatch, split_pair

EVAL_SPLIT = "eval_split"  # meta column naming the evaluation split of each pair
log = logging.getLogger(__name__)


class RewardModule(TrainingModule):
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
        gradient_checkpointing: recompute activations in the backward pass to save memory.
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
        shared_prompt: each pair's prompt is computed once (`lit_rlhf.ops.shared_prompt`: one
            packed row `[prompt, chosen, rejected]` with a block mask, each completion scored at
            its own last token); same rewards and gradients as the padded rows. Backbones whose
            attention takes no 4D mask (`flash_attention_2`) use the padded rows (warned).
        lora: train a LoRA adapter (and the head) on the frozen causal LM `model` instead of
            its weights (`lit_rlhf.models.adapters.lora_config` lists the forms). The export
            then also writes the adapter alone to `export_dir/adapter`.
        optimizer_in_backward: step each parameter as soon as its gradient is complete in the
            backward pass (less peak memory, same weights; see `PolicyModule`).
        release_host_memory: on CPU, hand freed heap back to the system: `phases`, `layers`
            or `null` (see `PolicyModule`).

    Optimiser, schedule, exact resume, start-up checks and the export at fit end are
    `TrainingModule`'s.
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
        gradient_checkpointing: bool = False,
        export_dir: str | None = None,
        use_margin: bool = False,
        center_coef: float = 0.0,
        group_columns: Sequence[str] = ("batch", "confidence"),
        calibration_bins: int = 10,
        score_batch_size: int = 16,
        on_nonfinite: Literal["error", "skip"] = "error",
        shared_prompt: bool = True,
        lora: dict[str, Any] | None = None,
        optimizer_in_backward: bool = False,
        release_host_memory: Literal["phases", "layers"] | None = None,
    ) -> None:
        super().__init__()
        # hparams: the effective init args (`lit_rlhf.modules.settings`). The CLI gives the
        # DataModule `tokenizer or model`: record the same resolved name, or a logger refuses to
        # merge the two ("tokenizer" differs)
        record_settings(self, inspect.currentframe(), tokenizer=tokenizer or model)
        self.set_training_settings(lr=lr, weight_decay=weight_decay, adam_eps=adam_eps, adam_betas=adam_betas,
                                   warmup_steps=warmup_steps, warmup_ratio=warmup_ratio, lr_scheduler=lr_scheduler,
                                   export_dir=export_dir, on_nonfinite=on_nonfinite,
                                   optimizer_in_backward=optimizer_in_backward, release_host_memory=release_host_memory)
        if center_coef < 0:
            raise ValueError(f"center_coef must be >= 0, got {center_coef}")
        if calibration_bins < 1 or score_batch_size < 1:
            raise ValueError(f"calibration_bins and score_batch_size must be >= 1, got {calibration_bins}, {score_batch_size}")
        self.use_margin, self.center_coef = bool(use_margin), center_coef
        self.calibration_bins, self.score_batch_size = calibration_bins, score_batch_size
        self.shared_prompt = bool(shared_prompt)
        self.model_name = model
        self.tokenizer = models.load_tokenizer(tokenizer or model)
        self.lora_config = adapters.lora_config(lora)
        if self.lora_config is None:
            self.reward_model = models.load_scalar_model(model, self.tokenizer, dtype)
        else:  # the adapter `reward` on a frozen causal LM base, and a trained head
            self.reward_model, peft_model = scalar_adapters.lora_scalar_model(model, self.tokenizer, dtype, self.lora_config)
            object.__setattr__(self, "reward_peft", peft_model)  # the body is reward_model.backbone
        if gradient_checkpointing:
            self.reward_model.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.group_columns = tuple(group_columns)
        self.eval_metrics = nn.ModuleDict({stage: pair_metrics() for stage in ("val", "test")})
        # the DataModule's named evaluation splits (meta "eval_split", e.g. TL;DR's "validation" and
        # "validation_cnndm") get their own accuracy, `{stage}/{split}/accuracy`
        record_columns = self.group_columns + (() if EVAL_SPLIT in self.group_columns else (EVAL_SPLIT,))
        self.eval_records = nn.ModuleDict({stage: PreferenceRecords(record_columns) for stage in ("val", "test")})

    # ----------------------------------------------------------------------------------------
    # rewards
    # ----------------------------------------------------------------------------------------

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Reward (N,) of each row, read at its last real token (D12), any padding side (D14)."""
        return self.reward_model.score(input_ids, attention_mask)

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """Also: `use_margin` needs PreferenceBatches that carry a margin."""
        problems = super().check_config(trainer, datamodule)
        if (self.use_margin and datamodule is not None and checks.yields(datamodule, "PreferenceBatch")
                and getattr(datamodule, "margin_from", "") is None):
            problems.append(
                f"{type(self).__name__} has use_margin=true but {type(datamodule).__name__} has no margin_from, so its "
                "batches carry no margin: set margin_from ('confidence' for TL;DR, 'score_difference' for "
                "UltraFeedback) or use_margin: false"
            )
        return problems

    def pair_rewards(self, batch: PreferenceBatch) -> tuple[Tensor, Tensor]:
        """(chosen, rejected) rewards, (B,) each in float32, from one forward over the 2B rows."""
        if not isinstance(batch, PreferenceBatch):
            raise TypeError(f"RewardModule needs a PreferenceBatch, got {type(batch).__name__}")
        if self.shared_prompt:
            rewards = grouped_scalar_scores(self.reward_model, batch.input_ids, batch.attention_mask, batch.sharing)
        else:
            rewards = self(batch.input_ids, batch.attention_mask)
        return split_pair(rewards.float())  # (B,), (B,)

    def _margin(self, batch: PreferenceBatch) -> Tensor | None:
        if not self.use_margin:
            return None
        if batch.margin is None:
            raise ValueError(
                "use_margin=True but the PreferenceBatch has no margin: set the DataModule's `margin_from` "
                "(TL;DR: 'confidence'; UltraFeedback: the score difference), or set use_margin=False"
            )
        return batch.margin.float()  # (B,)

    def _loss(self, batch: PreferenceBatch):
        chosen, rejected = self.pair_rewards(batch)  # (B,), (B,)
        return bradley_terry_loss(chosen, rejected, self._margin(batch), self.center_coef), chosen, rejected

    # ----------------------------------------------------------------------------------------
    # steps
    # ----------------------------------------------------------------------------------------

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

    def _eval_step(self, batch: PreferenceBatch, stage: str) -> None:
        out, chosen, rejected = self._loss(batch)
        n = batch.num_pairs
        diff = (chosen - rejected).detach()  # (B,)
        metrics = self.eval_metrics[stage]
        for name, value in (("loss", out.loss.detach()), ("accuracy", out.accuracy), ("chosen", out.chosen_mean),
                            ("rejected", out.rejected_mean), ("margins", out.margin_mean)):
            metrics[name].update(value, weight=n)
            key = f"{stage}/loss" if name == "loss" else f"{stage}/rewards/{name}"
            self.log(key, metrics[name], on_step=False, on_epoch=True, prog_bar=name in ("loss", "accuracy"), batch_size=n)
        self.eval_records[stage].update(diff, batch.meta or {})

    def validation_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_records("val")

    def on_test_epoch_end(self) -> None:
        self._log_records("test")

    # ----------------------------------------------------------------------------------------
    # grouped accuracy (D16) and calibration (D18)
    # ----------------------------------------------------------------------------------------

    def _log_records(self, stage: str) -> None:
        records = self.eval_records[stage]
        if records.update_count == 0:
            return
        diffs, groups = records.compute()  # synced over processes: identical on every rank
        records.reset()
        correct = diffs > 0  # (N,) ties count as wrong, as in the loss's accuracy
        tables = {}
        for column, labels in groups.items():
            rows = grouped_accuracy(correct, labels)
            if not rows:
                continue
            if column == EVAL_SPLIT and column not in self.group_columns:
                for value, accuracy, count in rows:
                    self.log(f"{stage}/{metric_safe(value)}/accuracy", accuracy, on_step=False, on_epoch=True,
                             sync_dist=False, batch_size=count)
                continue
            tables[column] = rows
            for value, accuracy, count in rows:
                self.log(f"{stage}/accuracy_by_{column}/{metric_safe(value)}", accuracy, on_step=False, on_epoch=True,
                         sync_dist=False, batch_size=count)
        buckets = calibration_buckets(diffs, self.calibration_bins)
        ece = sum(b["count"] * abs(b["accuracy"] - b["predicted"]) for b in buckets) / max(1, diffs.numel())
        self.log(f"{stage}/calibration/ece", ece, on_step=False, on_epoch=True, sync_dist=False)
        if self._trainer is None or self.trainer.sanity_checking or not self.trainer.is_global_zero:
            return
        for experiment in self._tensorboard_experiments():
            step = self.global_step
            for column, rows in tables.items():
                experiment.add_text(f"{stage}/accuracy_by_{column}", accuracy_table(column, rows), step)
            experiment.add_figure(f"{stage}/calibration", calibration_figure(buckets, stage), step, close=True)

    def _tensorboard_experiments(self) -> list[Any]:
        from lightning.pytorch.loggers import TensorBoardLogger

        return [lg.experiment for lg in self.trainer.loggers if isinstance(lg, TensorBoardLogger)]

    # ----------------------------------------------------------------------------------------
    # D15: reward normalisation on reference responses
    # ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def score_texts(self, prompts: Sequence[str], completions: Sequence[str], batch_size: int | None = None,
                    chat: bool = False) -> Tensor:
        """Rewards (N,) of `prompt + completion + EOS` texts, tokenised as the DataModules do.

        Prompts are encoded with `lit_rlhf.data.formatting.encode_prompt` (`chat=True`: the text is
        already chat-templated) and completions with `encode_completion` (EOS appended, D3), so a
        TL;DR completion should carry its leading space. Rows are right padded in micro-batches.
        Under DDP each process scores an equal share (padded by repeats) and the rewards are gathered.
        """
        from lit_rlhf.data.formatting import encode_completion, encode_prompt

        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if not prompts:
            raise ValueError("no reference texts to score")
        size = batch_size or self.score_batch_size
        world, rank = self._world()
        per_rank = math.ceil(len(prompts) / world)
        indices = [(rank + world * i) % len(prompts) for i in range(per_rank)]  # strided share, padded by wrap-around
        pad = self.tokenizer.pad_token_id
        was_training = self.reward_model.training
        self.reward_model.eval()
        local = []
        for start in range(0, per_rank, size):
            rows = [encode_prompt(self.tokenizer, prompts[i], chat=chat) + encode_completion(self.tokenizer, completions[i])
                    for i in indices[start:start + size]]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.bool)
            for j, r in enumerate(rows):
                ids[j, : len(r)] = torch.as_tensor(r)
                mask[j, : len(r)] = True
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
        """D15: shift the head bias so the mean reward of these reference responses is 0.

        Returns (mean before, mean after). The reward is linear in the bias, so the mean after is
        `mean_before - shift` exactly, up to float rounding; it is not re-scored.
        """
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

    def _world(self) -> tuple[int, int]:
        if self._trainer is None:
            return 1, 0
        return self.trainer.world_size, self.trainer.global_rank

    # ----------------------------------------------------------------------------------------
    # optimisation, checkpoints, export
    # ----------------------------------------------------------------------------------------

    def optimizer_param_groups(self) -> list[dict[str, Any]]:
        return decay_groups(self.reward_model, self.weight_decay)

    def export_hf(self, directory: str | Path) -> Path:
        """Write an `AutoModelForSequenceClassification` (num_labels=1) and the tokenizer.

        See the module docstring (and `lit_rlhf.models.to_sequence_classifier`) for where the head
        bias goes. Load it back with `lit_rlhf.models.load_reward_model(directory)`. With LoRA
        the adapter is merged into that classifier, and also written alone (PEFT format, with
        `scalar_head.safetensors`) to `directory/adapter`, which PPO/GRPO/RLOO with LoRA on the
        same base take as `reward_model` as a frozen adapter on their shared base.
        """
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
