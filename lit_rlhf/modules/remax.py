"""ReMax: REINFORCE whose baseline is the reward of the policy's greedy response."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.losses import remax_advantages, rloo_loss
from lit_rlhf.ops import kl_penalized_sequence_rewards
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.types import PromptBatch, Rollout


class ReMaxModule(OnlineModule):
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Large Language Models", Algorithm 1; `lit_rlhf.losses.remax`).

    Each training step takes B prompts and:

    1. samples `num_generations` responses per prompt (1 in the paper) and, in the same rollout,
       each prompt's greedy response (`rollout_extras`: the same backend, `do_sample` off); the
       reward sources score both, and the rollout hooks shape both alike (D23's EOS trick), so
       the greedy reward travels to the update as the per-row extra `greedy_scores`;
    2. r_i = score_i - `kl_coef` * sum_t log(pi/pi_ref)(y_i,t) (`ops.kl_penalized_sequence_rewards`;
       the paper's Algorithm 1 has no KL term: `kl_coef` 0 by default, no reference loaded);
    3. A_i = r_i - r(x_i, y_greedy_i) (`losses.remax_advantages`);
    4. one on-policy REINFORCE step on the summed sequence log-prob (`losses.rloo_loss`).

    Logs the `OnlineModule` objective stats plus `policy/loss`, `rewards/greedy` (the mean
    baseline), `rewards/kl_penalised` (mean r_i) and `advantages/{mean,abs_mean}`.

    Args:
        num_generations: sampled responses per prompt, all sharing the prompt's greedy baseline.
        kl_coef: KL coefficient of the sequence reward (0: no reference model is loaded).
        temperature: sampling temperature, also dividing the logits of every log-prob (1.0).
        **kwargs: `OnlineModule` (reward sources with `reward_normalization: none`: the baseline
            is a raw reward, reference, sampling, micro_batch_size, ...) and `PolicyModule`.
    """

    def __init__(self, num_generations: int = 1, kl_coef: float = 0.0, temperature: float = 1.0, **kwargs: Any) -> None:
        super().__init__(temperature=temperature, **kwargs)
        if num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {num_generations}")
        if kwargs.get("reward_normalization", "none") != "none":
            raise ValueError("ReMax's baseline is the greedy response's raw reward: reward_normalization must be 'none'")
        self.num_generations = num_generations
        self.init_kl(kl_coef)

    @property
    def repeats(self) -> int:
        return self.num_generations

    @property
    def needs_rollout_logps(self) -> bool:
        return self.kl_coef > 0  # only the KL penalty reads the sampling-time log-probs

    def rollout_extras(self, batch: PromptBatch, rollout: Rollout) -> dict[str, Tensor]:
        greedy = self.greedy_rollout(batch)  # (B rows) decoded, scored and shaped in the rollout
        return {"greedy_scores": greedy.scores.float().repeat_interleave(self.repeats)}  # (B*k,)

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        group, mask = self.repeats, rollout.loss_mask  # (N, R)
        ref_logps = rollout.ref_logps if self.kl_coef > 0 else None
        rewards, _ = kl_penalized_sequence_rewards(rollout.scores.float(), rollout.logps, ref_logps, mask, self.kl_coef)  # (N,)
        advantages = remax_advantages(rewards, rollout.extras["greedy_scores"])  # (N,)

        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            logps = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                mask[rows], self.logprob_temperature, groups=rows // group if group > 1 else None,
            )  # (n, R)
            loss = rloo_loss(logps, advantages[rows], mask[rows])
            return loss, {"policy/loss": loss.detach()}

        stats = self.run_updates(mask.shape[0], 1, 1, loss_fn)
        stats["rewards/greedy"] = rollout.extras["greedy_scores"].mean()
        stats["rewards/kl_penalised"] = rewards.mean()
        stats["advantages/mean"] = advantages.mean()
        stats["advantages/abs_mean"] = advantages.abs().mean()
        return rollout, stats
