"""DAPO: GRPO with clip-higher, dynamic sampling, the token mean and overlong filtering."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rlhf.losses.dapo import informative_groups
from lit_rlhf.modules.grpo import GRPOModule
from lit_rlhf.online.dynamic_sampling import cat_rollouts, group_rows, take_rows
from lit_rlhf.training.base import CHECKPOINT_KEY
from lit_rlhf.types import PromptBatch, Rollout


class DAPOModule(GRPOModule):
    """DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale").

    `GRPOModule` with the paper's four changes:

    - **clip-higher** (Sec. 3.1): the ratio is clipped to [1 - 0.2, 1 + 0.28] by default, so
      unlikely tokens can gain probability before the clip stops them;
    - **dynamic sampling** (Sec. 3.2, Eq. 11): `collect_rollout` drops the groups whose G rewards
      are all equal (zero advantage, no gradient) and samples more prompts until the batch holds B
      informative groups, at most `max_sampling_rounds` rounds (`online.dynamic_sampling`; its
      refill counter is saved in checkpoints);
    - **token-level loss** (Sec. 3.3): `aggregation` is pinned to `token_mean`, every token of the
      minibatch weighing the same;
    - **overlong filtering** (Sec. 3.4): `loss_mask` leaves out the completions with no EOS within
      `max_new_tokens` (they still count in the group statistics of the advantages).

    The paper also removes the KL term (Sec. 2.3): `kl_coef` is 0 by default.

    Logs `GRPOModule`'s stats plus `dynamic_sampling/{rounds,informative_groups,filled_groups,
    rollouts_per_step}` when dynamic sampling is on.

    Args:
        clip_eps_low: lower clip range of the ratio (1 - eps_low; the paper's 0.2).
        clip_eps_high: upper clip range (1 + eps_high; the paper's 0.28).
        kl_coef: weight of the k3 KL to the reference added to the loss per token, as in
            `GRPOModule`; 0 (the paper drops it) skips the reference model entirely.
        dynamic_sampling: drop the groups whose rewards are all equal and sample more prompts
            (Eq. 11); not available with asynchronous rollouts (`AsyncRollouts`).
        max_sampling_rounds: bound on the rounds of sampling per step (the first included).
        mask_truncated: overlong filtering: completions with no EOS are masked out of the loss.
        **kwargs: every `GRPOModule` argument but `aggregation` (num_generations, scale,
            num_iterations, num_minibatches, temperature), `OnlineModule` and `PolicyModule`.
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.28,
        kl_coef: float = 0.0,
        dynamic_sampling: bool = True,
        max_sampling_rounds: int = 4,
        mask_truncated: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, kl_coef=kl_coef,
                         aggregation="token_mean", **kwargs)
        if max_sampling_rounds < 1:
            raise ValueError(f"max_sampling_rounds must be >= 1, got {max_sampling_rounds}")
        self.dynamic_sampling, self.max_sampling_rounds = bool(dynamic_sampling), max_sampling_rounds
        self.mask_truncated = bool(mask_truncated)
        self.refill_batches = 0  # prompts batches drawn by dynamic sampling; saved in checkpoints

    def collect_rollout(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        if self.dynamic_sampling:
            return self.dynamic_sample(batch)
        return super().collect_rollout(batch)

    def loss_mask(self, rollout: Rollout) -> Tensor:
        mask = super().loss_mask(rollout)  # (N, R)
        return mask & rollout.has_eos.unsqueeze(1) if self.mask_truncated else mask

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[CHECKPOINT_KEY]["refill_batches"] = self.refill_batches

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.refill_batches = int(checkpoint.get(CHECKPOINT_KEY, {}).get("refill_batches", 0))

    def refill_batch(self, size: int, index: int) -> PromptBatch:
        """The `index`-th batch of `size` prompts of the refill stream (see the module docstring)."""
        trainer = self.trainer
        loader = trainer.train_dataloader
        loader = getattr(loader, "iterables", loader)  # a CombinedLoader wraps the DataLoader
        dataset, collate = loader.dataset, loader.collate_fn
        dm = getattr(trainer, "datamodule", None)
        seed = int(getattr(dm, "seed", 0) or 0)
        generator = torch.Generator().manual_seed(seed + 7919 * index)
        order = torch.randperm(len(dataset), generator=generator)
        rank, world = trainer.global_rank, max(1, trainer.world_size)
        if len(dataset) < size * world:
            order = order.repeat(size * world // len(dataset) + 1)
        rows = order[rank * size: (rank + 1) * size].tolist()
        batch = collate([dataset[i] for i in rows])
        return batch.to(self.device)


    def dynamic_sample(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """`collect_rollout` with dynamic sampling: (rollout of B informative groups when it can,
        each source's rewards on those rows, stats)."""
        group = self.repeats
        size = batch.input_ids.shape[0]
        kept: list[tuple[Rollout, dict[str, Tensor]]] = []
        dropped: list[tuple[Rollout, dict[str, Tensor]]] = []
        n_kept = rounds = generated = 0
        current, source_stats = batch, {}
        while True:
            rollout, per_source, sampled = super().collect_rollout(current)
            source_stats = source_stats or sampled  # the sampler's stats of the step's own prompts
            rounds += 1
            generated += rollout.response_ids.shape[0]
            informative = informative_groups(rollout.scores.float(), group)  # (b,)
            for mask, bucket in ((informative, kept), (~informative, dropped)):
                if bool(mask.any()):
                    rows = group_rows(mask.nonzero().flatten(), group)
                    bucket.append((take_rows(rollout, rows), {k: v[rows] for k, v in per_source.items()}))
            n_kept += int(informative.sum())
            strategy = self.trainer.strategy
            need_more = strategy.reduce_boolean_decision(n_kept < size, all=False)
            if not need_more or rounds >= self.max_sampling_rounds:
                break
            current = self.refill_batch(size, self.refill_batches)
            self.refill_batches += 1
        found = n_kept
        parts = kept + dropped  # informative first; dropped groups only top a short batch up
        rollout = cat_rollouts([r for r, _ in parts], self.tokenizer.pad_token_id)
        per_source = {k: torch.cat([s[k] for _, s in parts]) for k in parts[0][1]}
        rows = torch.arange(size * group, device=rollout.scores.device)
        rollout = take_rows(rollout, rows)
        per_source = {k: v[rows] for k, v in per_source.items()}
        world = max(1, self.trainer.world_size)
        self.episodes += (generated - size * group) * world  # the rows trained on are counted by the step
        stats = {
            **source_stats,
            "dynamic_sampling/rounds": torch.tensor(float(rounds)),
            "dynamic_sampling/informative_groups": torch.tensor(float(found)),
            "dynamic_sampling/filled_groups": torch.tensor(float(max(0, size - found))),
            "dynamic_sampling/rollouts_per_step": torch.tensor(generated / (size * group)),
        }
        return rollout, per_source, stats
