"""Rejection-sampling fine-tuning (best-of-N): sample, score, keep the best, SFT on them."""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor

from lit_rlhf.losses import nll_loss, rejection_sampling_mask
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.types import Rollout


class RejectionSamplingModule(OnlineModule):
    """Online, iterative rejection sampling (Lambert, "RLHF", ch. 10; Llama 2's rejection-sampling
    fine-tuning, Touvron et al. 2023, Sec. 3.2.3; RAFT, Dong et al. 2023) with
    `lit_rlhf.losses.best_of_n`.

    Each training step takes B prompts and:

    1. samples N = `num_generations` responses per prompt and scores them with the reward
       sources (rollout hooks included); no log-probs are computed (`needs_rollout_logps`
       False) and no reference is loaded: the method has no KL term;
    2. keeps the best response of each prompt (`selection: per_prompt`, best-of-N: B rows) or
       the `top_k` best of the whole rollout (`selection: top_k`, on each rank's rollout;
       `losses.rejection_sampling_mask`);
    3. fine-tunes on the kept responses: `num_iterations` passes of `num_minibatches`
       minibatches, each one optimizer step on the token-mean NLL (`losses.nll_loss`) of the
       log-probs at temperature 1 (the policy's own distribution), exact over the minibatch
       whatever `micro_batch_size`.

    Logs the `OnlineModule` stats (scores of all samples, lengths; no entropy or KL) plus
    `policy/loss`, `rewards/kept` (mean score of the kept responses) and `rewards/kept_gain`
    (that minus the mean score of all samples).

    Args:
        num_generations: N, responses per prompt (>= 2).
        selection: `per_prompt` (the best of each prompt's N) or `top_k` (the k best overall).
        top_k: responses kept per rollout with `selection: top_k`.
        num_iterations: passes over the kept responses per rollout.
        num_minibatches: minibatches per pass (they must divide the kept rows).
        temperature: sampling temperature (1.0).
        **kwargs: `OnlineModule` (reward sources, sampling, micro_batch_size, ...), `PolicyModule`.
    """

    accepts_environment = True  # one trajectory per row: a row may be an episode

    def __init__(self, num_generations: int = 4, selection: Literal["per_prompt", "top_k"] = "per_prompt",
                 top_k: int | None = None, num_iterations: int = 1, num_minibatches: int = 1,
                 temperature: float = 1.0, **kwargs: Any) -> None:
        super().__init__(temperature=temperature, **kwargs)
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (a best of one is no selection), got {num_generations}")
        if selection not in ("per_prompt", "top_k") or (selection == "top_k") != (top_k is not None):
            raise ValueError(f"selection 'per_prompt' takes no top_k, 'top_k' needs one; got {selection!r}, top_k={top_k}")
        if num_iterations < 1 or num_minibatches < 1 or (top_k is not None and top_k < 1):
            raise ValueError("num_iterations, num_minibatches and top_k must be >= 1")
        self.num_generations, self.selection, self.top_k = num_generations, selection, top_k
        self.num_iterations, self.num_minibatches = num_iterations, num_minibatches

    @property
    def repeats(self) -> int:
        return self.num_generations

    @property
    def needs_rollout_logps(self) -> bool:
        return False  # the update is an NLL on the kept rows: it never reads sampling-time log-probs

    def updates_per_rollout(self) -> int:
        return self.num_iterations * self.num_minibatches

    def update_rows(self, prompts: int) -> int:
        return self.top_k if self.selection == "top_k" else prompts  # the kept responses (the split is checked)

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        problems, size = super().check_config(trainer, datamodule), getattr(datamodule, "batch_size", None)
        if self.selection == "top_k" and size and self.top_k > size * self.repeats:
            problems.append(f"top_k={self.top_k} is more than the {size * self.repeats} responses of a rollout")
        return problems

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        scores, mask, attention = rollout.scores.float(), rollout.loss_mask, rollout.response_attention_mask  # (N,), (N, R) x2
        kept = rejection_sampling_mask(scores, self.repeats, self.selection, self.top_k).nonzero().flatten()  # (K,)

        def loss_fn(index: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            rows = kept[index]
            logps = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                attention[rows], 1.0, groups=rows // self.repeats,
            )  # (n, R) at temperature 1: SFT on the policy's own distribution
            loss = nll_loss(logps, mask[rows])
            return loss, {"policy/loss": loss.detach()}

        tokens = mask[kept].sum(dim=1).float()  # (K,) a token mean over each whole minibatch
        stats = self.run_updates(kept.numel(), self.num_iterations, self.num_minibatches, loss_fn, row_weights=tokens,
                                 group_size=1)  # the kept rows, picked one by one
        stats["rewards/kept"] = scores[kept].mean()
        stats["rewards/kept_gain"] = scores[kept].mean() - scores.mean()
        return rollout, stats
