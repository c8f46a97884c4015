"""RLOO as its sources define it: REINFORCE with a leave-one-out baseline on whole responses."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.losses import rloo_advantages, rloo_loss
from lit_rlhf.ops import kl_penalized_sequence_rewards
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.types import Rollout


class RLOOModule(OnlineModule):
    """REINFORCE leave-one-out (Ahmadian et al. 2024; Lambert, "RLHF", RLOO section).

    Each training step takes B prompts and:

    1. samples k = `num_generations` responses per prompt (N = B*k rows, a prompt's k copies
       contiguous) and scores them once: the sampling policy's and the reference's per-token
       log-probs, the reward sources; callbacks shape the scores through the rollout hook (e.g.
       D23's EOS trick);
    2. one reward per response, the KL penalty inside it: r_i = score_i - `kl_coef` *
       sum_t log(pi(y_i,t)/pi_ref(y_i,t)) (`ops.kl_penalized_sequence_rewards`; no KL in the loss);
    3. leave-one-out advantages A_i = r_i - mean_{j != i} r_j over the prompt's other k-1
       responses (`losses.rloo_advantages`);
    4. one on-policy REINFORCE step: loss = -mean_i(A_i * log pi(y_i|x)), the SUMMED sequence
       log-prob, not length-normalised (`losses.rloo_loss`); gradient accumulation over
       `micro_batch_size` rows, weighted by their share of rows (exact).

    `GRPOModule(advantage: rloo)` is a different, hybrid method: GRPO's clipped per-token loss
    with the k3 KL in the loss, fed leave-one-out advantages.

    Logs the `OnlineModule` objective stats (scores, KL, entropy, RLHF reward = score - kl_coef *
    KL, lengths, EOS fraction, times, tokens/s) plus `policy/loss`, `rewards/kl_penalised`
    (mean r_i), `advantages/abs_mean` and `rewards/zero_std_fraction`.

    Args:
        num_generations: k, responses per prompt (>= 2; the paper uses 2 and 4).
        kl_coef: the KL coefficient of the sequence reward, the paper's beta (0.05; 0 = no KL: the
            reference is not loaded). Adapted by `KLControlCallback` when it is used.
        temperature: sampling temperature, also dividing the logits of every log-prob unless
            `logprob_temperature` is set apart (1.0: Ahmadian et al. sample from the policy itself).
        **kwargs: `OnlineModule` (reward sources, reference, sampling, micro_batch_size,
            max_grad_norm, total_episodes, completion logging) and `PolicyModule`.
    """

    accepts_environment = True  # one trajectory per row: a row may be an episode
    supports_tis = True  # the source's rollout correction weighs each token's log-prob (`losses.rloo_loss`)

    def __init__(self, num_generations: int = 4, kl_coef: float = 0.05, temperature: float = 1.0, **kwargs: Any) -> None:
        super().__init__(temperature=temperature, **kwargs)
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (the baseline is the other responses), got {num_generations}")
        self.num_generations = num_generations
        self.init_kl(kl_coef)

    @property
    def repeats(self) -> int:
        return self.num_generations

    def updates_per_rollout(self) -> int:
        return 1  # on-policy REINFORCE: one step per rollout

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        group = self.num_generations
        mask, attention = rollout.loss_mask, rollout.response_attention_mask  # (N, R): the policy's tokens, every token
        ref_logps = rollout.ref_logps if self.kl_coef > 0 else None
        rewards, kl = kl_penalized_sequence_rewards(rollout.scores.float(), rollout.logps, ref_logps, mask, self.kl_coef)  # (N,)
        advantages = rloo_advantages(rewards, group)  # (N,)

        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            logps = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                attention[rows], self.logprob_temperature, groups=rows // group,
            )  # (n, R); a group's rows share one prompt computation
            tis = self.tis_weights(rollout, rows, rollout.logps[rows], advantages[rows])  # (n, R) or None
            loss = rloo_loss(logps, advantages[rows], mask[rows], tis)
            return loss, {"policy/loss": loss.detach()}

        stats = self.run_updates(mask.shape[0], 1, 1, loss_fn)
        grouped = rewards.view(-1, group)  # (B, k)
        stats["rewards/kl_penalised"] = rewards.mean()
        stats["rewards/zero_std_fraction"] = (grouped == grouped[:, :1]).all(dim=1).float().mean()
        stats["advantages/abs_mean"] = advantages.abs().mean()
        return rollout, stats
