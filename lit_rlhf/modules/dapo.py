"""DAPO: GRPO with clip-higher, dynamic sampling, the token mean and overlong filtering."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.training.base import CHECKPOINT_KEY
from lit_rlhf.online.dynamic_sampling import dynamic_sample
from lit_rlhf.modules.grpo import GRPOModule
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
            return dynamic_sample(self, batch)
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
