"""Direct preference optimisation: DPO, IPO, SLiC-hinge and GPO's exponential and Savage losses on
pairs (`lit_rlhf.losses.dpo_loss`)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from lit_rlhf import models
from lit_rlhf.losses import DPO_LOSS_TYPES, DPOLossType, dpo_loss
from lit_rlhf.models import adapters
from lit_rlhf.modules.pairwise import PairwiseModule
from lit_rlhf.ops import masked_mean
from lit_rlhf.training.reference_table import (
    datamodule_loaders, export_overwrites_reference, precompute_reference_logps, sequence_keys
)
from lit_rlhf.types import PreferenceBatch, split_pair

log = logging.getLogger(__name__)


class DPOModule(PairwiseModule):
    """DPO (Rafailov et al. 2023) and its IPO / hinge / exponential / Savage variants on a `PreferenceBatch`.

    Rows `[:B]` chosen and `[B:]` rejected go through the reference (first, without grad) and the
    policy in one forward pass each (`PairwiseModule`); sequence log-probs are sums over
    completion tokens, and the loss family `f(beta * h)` is `dpo_loss`.

    Args:
        beta: KL strength; the implicit reward is `beta * log(pi / pi_ref)`. The DPO paper uses
            0.1, and 0.5 for TL;DR summarisation (App. B; see configs/tldr/dpo.yaml).
        loss_type: `sigmoid` (DPO), `hinge` (SLiC), `ipo`, or GPO's `exponential` and `savage`
            (Tang et al. 2024); the functions f are in `lit_rlhf.losses.dpo_loss`.
        ref_model: reference policy name; `None` = the initial policy (the `model` checkpoint).
        precompute_ref_logps: compute every reference sequence log-prob once at the start of
            fit over the DataModule's loaders, keep them keyed by each sequence's content
            (`lit_rlhf.training.reference_table`) and free the reference model; rebuilt, not
            checkpointed, on resume.
        nll_coef: weight of an added NLL term on the chosen completions (token mean), as in
            "DPO + NLL" / RPO (Lambert, RLHF book, Sec. 8.2); 0 disables it.
        **kwargs: `PolicyModule` arguments (model, tokenizer, dtype, optimiser, schedule, export).
    """

    def __init__(
        self,
        beta: float = 0.1,
        loss_type: DPOLossType = "sigmoid",
        ref_model: str | None = None,
        precompute_ref_logps: bool = False,
        nll_coef: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {', '.join(DPO_LOSS_TYPES)}")
        if nll_coef < 0:
            raise ValueError(f"nll_coef must be >= 0, got {nll_coef}")
        self.beta, self.loss_type, self.nll_coef = beta, loss_type, nll_coef
        self.precompute_ref_logps, self.ref_model_name = precompute_ref_logps, ref_model
        self.ref_logps_cache: dict[bytes, float] = {}  # content key -> reference sequence log-prob (precompute only)
        if not precompute_ref_logps:
            self.load_reference(ref_model, self.model_dtype)

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """Also: the run's `export_dir` must not overwrite the reference a precomputed table is rebuilt from."""
        problems = super().check_config(trainer, datamodule)
        if self.precompute_ref_logps and (problem := export_overwrites_reference(self.ref_model_name or self.model_name, self.export_dir)):
            problems.append(problem)
        return problems

    def reference_logps(self, batch: PreferenceBatch) -> Tensor:
        """Reference sequence log-probs (2B,) of the batch, live or from the precomputed table."""
        if not self.precompute_ref_logps:
            per_token = self.frozen_logps("ref_model", batch.input_ids, batch.attention_mask, batch.loss_mask,
                                          sharing=batch.sharing)
            return self.sequence_logps(per_token, batch.loss_mask)  # (2B,)
        keys = sequence_keys(batch.input_ids, batch.attention_mask, batch.loss_mask)
        missing = [i for i, key in enumerate(keys) if key not in self.ref_logps_cache]
        if missing:
            raise KeyError(f"no precomputed reference log-probs for rows {missing} of this batch: with "
                           "precompute_ref_logps=true every sequence must come from the DataModule dataloaders that were "
                           "precomputed at the start of fit/validate/test (call `precompute_reference` for other data)")
        values = [self.ref_logps_cache[key] for key in keys]
        return torch.tensor(values, dtype=torch.float32, device=batch.input_ids.device)  # (2B,)

    def precompute_reference(self, dataloaders: Iterable[Iterable[PreferenceBatch]]) -> int:
        """Fill `ref_logps_cache` from `dataloaders` (`lit_rlhf.training.reference_table`) with the
        reference loaded for the time of it; returns its size."""
        self.ref_logps_cache.update(self._reference_table(dataloaders))  # the reference is freed on return
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        log.info("precomputed %d reference sequence log-probs", len(self.ref_logps_cache))
        return len(self.ref_logps_cache)

    def _reference_table(self, dataloaders: Iterable[Iterable[PreferenceBatch]]) -> dict[bytes, float]:
        """The table of a freshly loaded reference: `ref_model` or the `model` checkpoint, the same on
        a resumed run (with LoRA and no `ref_model`, the policy's base with the adapter off)."""
        if self.ref_model_name is None and self.lora_config is not None:
            ref = adapters.AdapterView(self.policy, None)
        else:
            ref = models.load_reference_model(self.ref_model_name or self.model_name, self.tokenizer, self.model_dtype)
            ref.to(self.device)
        # a shared LoRA base under FSDP2 / ZeRO-3: every forward is a collective, every rank runs every batch
        collective = isinstance(ref, adapters.AdapterView) and any(
            isinstance(p, DTensor) or hasattr(p, "ds_id") for p in self.policy.parameters())

        def score(batch: PreferenceBatch) -> Tensor:
            per_token = self.model_logps(ref, batch.input_ids, batch.attention_mask, batch.loss_mask, sharing=batch.sharing)
            return self.sequence_logps(per_token, batch.loss_mask)  # (N,)

        return precompute_reference_logps(score, dataloaders, self.device, self.attached_trainer, collective)

    def on_fit_start(self) -> None:
        super().on_fit_start()
        if self.precompute_ref_logps:
            names = ("train_dataloader",) + (("val_dataloader",) if self.trainer.limit_val_batches != 0 else ())
            self.precompute_reference(datamodule_loaders(self.trainer, names))

    def on_validation_start(self) -> None:
        if self.precompute_ref_logps and self.trainer.state.fn == "validate":
            self.precompute_reference(datamodule_loaders(self.trainer, ("val_dataloader",)))

    def on_test_start(self) -> None:
        if self.precompute_ref_logps:
            self.precompute_reference(datamodule_loaders(self.trainer, ("test_dataloader",)))

    def compute_loss(self, batch: PreferenceBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of one batch and the detached statistics to log (names `{group}/{name}`)."""
        if not isinstance(batch, PreferenceBatch):
            raise TypeError(f"DPOModule needs a PreferenceBatch (chosen rows first), got {type(batch).__name__}")
        # the reference first: its forward pass's temporaries are freed before the policy's graph exists
        ref_chosen, ref_rejected = split_pair(self.reference_logps(batch))  # (B,), (B,)
        logps = self.pair_logps(batch)
        policy_chosen, policy_rejected = logps.chosen, logps.rejected  # (B,), (B,)
        out = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, self.beta, self.loss_type)
        stats = {
            "rewards/chosen": out.chosen_rewards.mean(),
            "rewards/rejected": out.rejected_rewards.mean(),
            "rewards/margins": out.margins.mean(),
            "rewards/accuracies": out.accuracies,
            "logps/chosen": policy_chosen.detach().mean(),
            "logps/rejected": policy_rejected.detach().mean(),
            "loss/preference": out.loss.detach(),
        }
        loss = out.loss
        if self.nll_coef > 0:
            chosen_per_token, _ = split_pair(logps.per_token)  # (B, T)
            chosen_mask, _ = split_pair(batch.loss_mask)  # (B, T)
            nll = -masked_mean(chosen_per_token, chosen_mask)  # token mean over the chosen completions
            loss = loss + self.nll_coef * nll
            stats["loss/nll"] = nll.detach()
        return loss, stats
