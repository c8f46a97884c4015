"""GRPO with in-loop generation: G completions per prompt, group-relative advantages; Dr. GRPO.

The GRPO family is one small subclass per paper, each diffable against `GRPOModule`:
`DrGRPOModule` (here), `DAPOModule` (`modules.dapo`), `GSPOModule` (`modules.gspo`) and
`ReinforcePPModule` (`modules.reinforce_pp`). A variant overrides the named steps of
`GRPOModule.update` (`advantages`, `loss_mask`, `policy_loss`, `token_mean`) and pins the base
arguments its paper fixes in its `super().__init__` call (`lit_rlhf.training.settings`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from lit_rlhf.distributed import gather_rows
from lit_rlhf.losses import (AdvantageScale, Aggregation, EntropyControl, GRPOLossOutput, entropy_bonus_penalty,
                             grpo_advantages, grpo_policy_loss, sampled_entropy)
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.online.moved import GRPO_MOVED
from lit_rlhf.training.base import CHECKPOINT_KEY
from lit_rlhf.types import Rollout

class GRPOModule(OnlineModule):
    """Group relative policy optimisation (DeepSeekMath, Shao et al. 2024, Sec. 4.1).

    Each training step takes B prompts and:

    1. samples `num_generations` (G) completions per prompt, contiguous (N = B*G rows), and scores
       them once: old log-probs only when the rollout gets more than one update (one pass over
       one minibatch is on-policy: the update's own forward pass gives them, a ratio of exactly
       1), reference log-probs only when `kl_coef` > 0, scores, shaped by the callbacks;
    2. `advantages`: (r - mean_group) / (std + eps) per completion, the std of `scale`
       (`losses.grpo_advantages`; `batch`: over every rank's rewards); a group of equal rewards gets 0;
    3. `num_iterations` passes over `num_minibatches` minibatches (one optimizer step each) of
       `policy_loss`: the clipped surrogate plus `kl_coef` times the k3 KL to the reference IN
       THE LOSS (`losses.grpo_policy_loss`, DeepSeekMath Eq. 3-4) over the tokens of `loss_mask`,
       aggregated by `aggregation` over the whole minibatch whatever `micro_batch_size`
       (micro-batches weigh their share of the minibatch's tokens, all ranks, or rows).

    A variant overrides those named steps (GRPO's clipped loss on RLOO's leave-one-out advantages
    is `advantages` returning `rloo_advantages(rollout.scores.float(), self.num_generations)`).
    With `shared_prompt` (default) a group's rows in one forward pass compute their prompt once
    (`lit_rlhf.ops.shared_prompt`), with the same log-probs and gradients.

    Logs the `OnlineModule` stats plus `policy/{loss,clipfrac,clipfrac_low,clipfrac_high,
    ratio_mean,first_ratio_mean}`, `objective/kl_loss` (the k3 token mean inside the loss),
    `advantages/abs_mean`, `rewards/group_std` and `rewards/zero_std_fraction` (groups whose G
    rewards are all equal).

    Args:
        num_generations: G, completions per prompt (>= 2).
        scale: what divides the group-centred rewards: the `group`'s std (GRPO), the `batch`'s
            std, or `none` (Dr. GRPO, Liu et al. 2025: `DrGRPOModule`).
        clip_eps_low: lower clip range of the ratio (1 - eps_low).
        clip_eps_high: upper clip range (1 + eps_high; > eps_low is DAPO's clip-higher).
        kl_coef: weight of the k3 KL to the reference added to the loss per token, DeepSeekMath's
            beta (0.04); 0 skips the reference model entirely. Adapted by `KLControlCallback`
            when it is used.
        aggregation: `token_mean`, `sequence_mean` (DeepSeekMath Eq. 3) or `constant_normalizer`
            (by N * max_new_tokens, Dr. GRPO).
        num_iterations: passes over each rollout (GRPO's mu).
        num_minibatches: minibatches per pass; one optimizer step each.
        temperature: sampling temperature, also dividing the logits of every log-prob unless
            `logprob_temperature` is set apart (1.0: DeepSeekMath's GRPO samples from the policy
            itself).
        entropy: entropy control (`losses.EntropyControl`), in YAML `{covariance: ..., bonus: ...}`:
            `covariance`, Clip-Cov or KL-Cov (Cui et al. 2025; `losses.CovarianceControl`:
            `{method: clip_cov, ratio: 2.0e-4, lower: 1.0, upper: 5.0}`) on each micro-batch's
            tokens; `bonus`, an entropy bonus, its coefficient fixed or adapted to a target entropy
            (`losses.EntropyBonus`: `{coef, target, step, min_coef, max_coef}`; the coefficient is
            checkpointed; logs `entropy/{coef,estimate}`); None = off. GRPO, Dr. GRPO and DAPO
            (their loss is GRPO's per-token one).
        **kwargs: `OnlineModule` (reward sources, reference, sampling, micro_batch_size,
            max_grad_norm, total_episodes, completion logging) and `PolicyModule`.
    """

    supports_tis = True
    accepts_environment = True
    moved_options: ClassVar[dict[str, str]] = GRPO_MOVED
    eps: ClassVar[float] = 1e-4
    """Added to the std that divides the advantages (a group of equal rewards gets 0, not NaN)."""
    takes_entropy_control: ClassVar[bool] = True  # `policy_loss` is GRPO's: `entropy` acts on it

    def __init__(
        self,
        num_generations: int = 4,
        scale: AdvantageScale = "group",
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        kl_coef: float = 0.04,
        aggregation: Aggregation = "token_mean",
        num_iterations: int = 1,
        num_minibatches: int = 1,
        temperature: float = 1.0,
        entropy: EntropyControl | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(temperature=temperature, **kwargs)
        entropy = EntropyControl(**entropy) if isinstance(entropy, dict) else entropy or EntropyControl()
        entropy_control, entropy_bonus = entropy.covariance, entropy.bonus
        if (entropy_control is not None or entropy_bonus is not None) and not self.takes_entropy_control:
            raise ValueError(f"{type(self).__name__}'s loss is not GRPO's per-token one: entropy (Clip-Cov, KL-Cov, "
                             "the entropy bonus) is for GRPOModule, DrGRPOModule and DAPOModule")
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (advantages are relative to the group), got {num_generations}")
        if scale not in ("group", "batch", "none"):
            raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
        if aggregation not in ("token_mean", "sequence_mean", "constant_normalizer"):
            raise ValueError(f"aggregation must be 'token_mean', 'sequence_mean' or 'constant_normalizer', got {aggregation!r}")
        if num_iterations < 1 or num_minibatches < 1:
            raise ValueError(f"num_iterations and num_minibatches must be >= 1, got {num_iterations} and {num_minibatches}")
        # the settings, read at run time (`lit_rlhf.training.settings`)
        self.num_generations, self.scale = num_generations, scale
        self.clip_eps_low, self.clip_eps_high, self.aggregation = clip_eps_low, clip_eps_high, aggregation
        self.num_iterations, self.num_minibatches = num_iterations, num_minibatches
        self.entropy_control, self.entropy_bonus = entropy_control, entropy_bonus
        self.entropy_coef = 0.0 if entropy_bonus is None else float(entropy_bonus.coef)  # checkpointed
        self.init_kl(kl_coef)

    @property
    def repeats(self) -> int:
        return self.num_generations

    def updates_per_rollout(self) -> int:
        return self.num_iterations * self.num_minibatches

    @property
    def needs_rollout_logps(self) -> bool:
        # one pass over one minibatch is on-policy: the old log-probs are the update's own
        # (detached) log-probs, so the rollout skips that extra forward pass
        return self.updates_per_rollout() > 1

    # the steps a variant overrides

    def advantages(self, rollout: Rollout) -> Tensor:
        """(N,) one advantage per completion (broadcast to its tokens by `policy_loss`), or (N, R)
        one per token; without gradient."""
        scores = rollout.scores.float()  # (N,)
        if self.scale == "batch":  # the std of the GLOBAL batch: every rank's rewards, this rank's slice
            everyone, own = gather_rows(scores)  # (W*N,)
            return grpo_advantages(everyone, self.num_generations, self.scale, self.eps)[own]
        # groups never straddle ranks (a prompt's G copies are sampled on one rank)
        return grpo_advantages(scores, self.num_generations, self.scale, self.eps)

    def loss_mask(self, rollout: Rollout) -> Tensor:
        """(N, R) bool: the tokens the loss is taken over (the policy's own tokens)."""
        return rollout.loss_mask

    def policy_loss(self, logps: Tensor, old_logps: Tensor | None, ref_logps: Tensor | None, advantages: Tensor,
                    mask: Tensor, token_weights: Tensor | None) -> GRPOLossOutput:
        """The loss of a micro-batch of n rows: logps (n, R) with gradient; old_logps (n, R) or None
        (on-policy); ref_logps (n, R) or None (`kl_coef` 0); advantages: the rows of `advantages`;
        mask: the rows of `loss_mask`; token_weights: the rollout correction's factor (n, R) or None
        (`OnlineModule.tis_weights`); with entropy settings, their terms (`entropy_terms`)."""
        penalty = None
        if self.entropy_control is not None or self.entropy_bonus is not None:
            token_weights, penalty = self.entropy_terms(logps, old_logps, advantages, mask, token_weights)
        return grpo_policy_loss(logps, old_logps, ref_logps, advantages, mask, self.clip_eps_low, self.clip_eps_high,
                                self.kl_coef, self.aggregation, max_completion_length=mask.shape[1],
                                token_weights=token_weights, token_penalty=penalty)

    def entropy_terms(self, logps: Tensor, old_logps: Tensor | None, advantages: Tensor, mask: Tensor,
                      token_weights: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """What the entropy settings add to `policy_loss`: (token_weights, times Clip-Cov's
        keep-mask; a per-token penalty, KL-Cov's plus the entropy bonus's term), None where none."""
        keep, penalty = None, None
        if self.entropy_control is not None:
            keep, penalty = self.entropy_control.apply(logps, old_logps, advantages, mask, self.clip_eps_low,
                                                       self.clip_eps_high)
        token_weights = keep if token_weights is None else token_weights if keep is None else token_weights * keep
        if self.entropy_bonus is not None and self.entropy_coef > 0:
            bonus = entropy_bonus_penalty(logps, mask, self.entropy_coef)
            penalty = bonus if penalty is None else penalty + bonus
        return token_weights, penalty

    @property
    def token_mean(self) -> bool:
        """Whether `policy_loss` is a token mean (micro-batches weigh their share of the tokens)
        rather than a mean over rows."""
        return self.aggregation == "token_mean"

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        group = self.num_generations
        mask, attention = rollout.loss_mask, rollout.response_attention_mask  # (N, R): the policy's tokens, every token
        # 1. advantages over the whole rollout (every group complete), the loss's tokens
        advantages = self.advantages(rollout)  # (N,) or (N, R)
        loss_mask = self.loss_mask(rollout)  # (N, R)
        ref_logps = rollout.ref_logps if self.kl_coef > 0 else None
        on_policy = rollout.logps is None
        filled = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device) if on_policy else None  # (N, R)

        # 2. the loss of a micro-batch of rows
        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            logps = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                attention[rows], self.logprob_temperature, groups=rows // group,
            )  # (n, R); a group's rows in this micro-batch share one prompt computation
            if on_policy:
                filled[rows] = torch.where(mask[rows], logps.detach().float(), 0.0)  # 0 off the policy's tokens
            old = None if on_policy else rollout.logps[rows]
            ref = None if ref_logps is None else ref_logps[rows]
            tis = self.tis_weights(rollout, rows, logps.detach() if on_policy else old, advantages[rows])  # (n, R) or None
            out = self.policy_loss(logps, old, ref, advantages[rows], loss_mask[rows], tis)
            return out.loss, {
                "loss/total": out.loss.detach(),
                "policy/loss": out.policy_loss,
                "policy/clipfrac": out.clipfrac,
                "policy/clipfrac_low": out.clipfrac_low,
                "policy/clipfrac_high": out.clipfrac_high,
                "policy/ratio_mean": out.ratio_mean,
                "objective/kl_loss": out.kl,
            }

        # 3. the updates: a token mean over the whole minibatch (all ranks), whatever
        # micro_batch_size, weighs each micro-batch by its share of the loss's tokens
        # (`run_updates`); a mean over rows (sequence_mean, constant_normalizer) by its rows
        tokens = loss_mask.sum(dim=1).float() if self.token_mean else None  # (N,)
        stats = self.run_updates(mask.shape[0], self.num_iterations, self.num_minibatches, loss_fn, row_weights=tokens)
        grouped = rollout.scores.float().view(-1, group)  # (B, G)
        per_row = advantages if advantages.dim() == 1 else advantages.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        stats["rewards/group_std"] = grouped.std(dim=1).mean()
        stats["rewards/zero_std_fraction"] = (grouped == grouped[:, :1]).all(dim=1).float().mean()
        stats["advantages/abs_mean"] = per_row.abs().mean()
        if self.entropy_bonus is not None:
            stats.update(self.adapt_entropy_coef(filled if on_policy else rollout.logps, mask))
        return (rollout._replace(logps=filled) if on_policy else rollout), stats

    def adapt_entropy_coef(self, logps: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """The entropy bonus's coefficient of this update and the sampled entropy estimate (to log);
        then the next update's coefficient (`EntropyBonus.next_coef`)."""
        entropy = sampled_entropy(logps, mask)
        stats = {"entropy/coef": torch.tensor(self.entropy_coef), "entropy/estimate": entropy}
        self.entropy_coef = self.entropy_bonus.next_coef(self.entropy_coef, float(entropy))
        return stats

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[CHECKPOINT_KEY]["entropy_coef"] = self.entropy_coef

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.entropy_coef = float(checkpoint.get(CHECKPOINT_KEY, {}).get("entropy_coef", self.entropy_coef))


class DrGRPOModule(GRPOModule):
    """Dr. GRPO, GRPO without its length and difficulty biases (Liu et al. 2025, "Understanding
    R1-Zero-Like Training: A Critical Perspective").

    The same as `GRPOModule` with two settings pinned: the advantage is the group-centred reward
    r - mean_group, not divided by the group's std (`scale: none`; `eps` 0: it has no use), and the per-token losses are summed and divided by a constant, N *
    max_new_tokens, instead of each response's length (`aggregation: constant_normalizer`).

    Args:
        **kwargs: every `GRPOModule` argument but `scale` and `aggregation`.
    """

    eps = 0.0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(scale="none", aggregation="constant_normalizer", **kwargs)
