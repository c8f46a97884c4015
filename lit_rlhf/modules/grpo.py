"""GRPO with in-loop generation: G completions per prompt, group-relative advantages."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from lit_rlhf.distributed import gather_rows
from lit_rlhf.losses import (
    AdvantageScale,
    Aggregation,
    clipped_token_loss,
    grpo_advantages,
    grpo_policy_loss,
    gspo_policy_loss,
    normalize_token_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from lit_rlhf.modules.base import CHECKPOINT_KEY
from lit_rlhf.modules.dynamic_sampling import dynamic_sample
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.types import PromptBatch, Rollout

ADVANTAGES = ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")


class GRPOModule(OnlineModule):
    """Group relative policy optimisation (DeepSeekMath, Shao et al. 2024).

    RLOO as its sources define it (KL in the sequence reward, REINFORCE on the summed
    sequence log-prob) is `RLOOModule`. `advantage: rloo` here is an explicit hybrid: GRPO's
    clipped per-token loss with the k3 KL in the loss, fed leave-one-out advantages.

    Each training step takes B prompts and:

    1. samples `num_generations` (G) completions per prompt, the G copies of a prompt
       contiguous (N = B*G rows), and scores them once: old log-probs (only when the rollout
       gets more than one update: with one pass over one minibatch the update is on-policy and
       its own forward pass gives them, as a ratio of exactly 1), reference log-probs (only
       when `kl_coef` > 0: with `kl_coef` 0 the reference is never loaded), scores; callbacks shape
       the scores through the rollout hook (`OnlineModule.apply_rollout_hooks`);
    2. one advantage per completion: `advantage: grpo` -> (r - mean_group) / (std_group + eps)
       with `scale: group | batch | none` (`losses.grpo_advantages`; `batch` takes the std
       over the global batch, every rank's rewards), or `advantage: rloo` ->
       the leave-one-out baseline (`losses.rloo_advantages`); a group whose rewards are all
       equal gets exactly 0;
    3. `num_iterations` passes over `num_minibatches` minibatches (one optimizer step each)
       with the clipped surrogate (eps low/high) plus `kl_coef` times the k3 KL to the reference
       IN THE LOSS (`losses.grpo_policy_loss`), aggregated by `aggregation` over the whole
       minibatch whatever `micro_batch_size`: micro-batch losses are weighted by their share of
       the minibatch's tokens (`token_mean`, counted over all ranks) or rows (the others).

    With `shared_prompt` (default) the rows of a group in one forward pass (rollout scoring:
    reference log-probs, reward model; the update's micro-batches) compute their prompt once
    (`lit_rlhf.ops.shared_prompt`), with the same log-probs and gradients.

    Logs the `OnlineModule` objective stats (scores, KL, entropy, RLHF reward = score -
    kl_coef * KL, lengths, EOS fraction, times, tokens/s) plus `policy/{loss,clipfrac,
    clipfrac_low,clipfrac_high,ratio_mean,first_ratio_mean}`, `objective/kl_loss` (the k3
    token mean inside the loss), `rewards/group_std` and `rewards/zero_std_fraction` (the
    fraction of groups whose G rewards are all equal).

    Args:
        num_generations: G, completions per prompt (>= 2).
        advantage: `grpo` (group-normalised) or `rloo` (leave-one-out baseline inside the GRPO
            loss: the hybrid; the textbook RLOO is `RLOOModule`).
        scale: GRPO's advantage scale: `group` std, `batch` std, or `none` (Dr. GRPO).
        eps: added to the std in the advantage.
        clip_eps_low: lower clip range of the ratio (1 - eps_low).
        clip_eps_high: upper clip range (1 + eps_high; > eps_low is DAPO's clip-higher).
        kl_coef: weight of the k3 KL to the reference in the loss, DeepSeekMath's beta (0.04); 0
            skips the reference model entirely. Adapted by `KLControlCallback` when it is used.
        aggregation: `token_mean`, `sequence_mean` or `constant_normalizer` (by N * max_new_tokens).
        num_iterations: passes over each rollout (GRPO's mu).
        num_minibatches: minibatches per pass; one optimizer step each.
        temperature: sampling temperature, also dividing the logits of every log-prob unless
            `logprob_temperature` is set apart (1.0: DeepSeekMath's GRPO samples from the policy
            itself).
        dynamic_sampling: DAPO's dynamic sampling (Yu et al. 2025, Eq. 11): groups whose G
            rewards are all equal are dropped and more prompts are sampled until the batch
            holds B informative groups, at most `max_sampling_rounds` rounds
            (`modules.dynamic_sampling`).
        max_sampling_rounds: bound on the rounds of sampling per step (the first included).
        mask_truncated: DAPO's overlong filtering (Yu et al. 2025, Sec. 3.4): completions with
            no EOS within `max_new_tokens` are masked out of the loss (they still count in the
            group statistics of the advantages).
        importance_sampling: `token` (GRPO's per-token ratio) or `sequence`: GSPO (Zheng et al.
            2025, Eq. 5-7), one length-normalised ratio per sequence, clipped per sequence
            (`losses.grpo_family.gspo_policy_loss`; the paper clips at 3e-4 / 4e-4).
        The `advantage` option also takes `reinforce_pp` (REINFORCE++, Hu et al. 2025: the k1 KL
        to the reference, weighted by `kl_coef`, in the per-token reward; per-token advantages
        normalised over the global batch; no critic; `kl_coef` then does not add a KL loss) and
        `reinforce_pp_baseline` (the same after subtracting each group's mean reward).
        **kwargs: `OnlineModule` (reward sources, reference, sampling, micro_batch_size,
            max_grad_norm, total_episodes, completion logging) and `PolicyModule`.
    """

    supports_tis = True

    def __init__(
        self,
        num_generations: int = 4,
        advantage: Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"] = "grpo",
        scale: AdvantageScale = "group",
        eps: float = 1e-4,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        kl_coef: float = 0.04,
        aggregation: Aggregation = "token_mean",
        num_iterations: int = 1,
        num_minibatches: int = 1,
        temperature: float = 1.0,
        dynamic_sampling: bool = False,
        max_sampling_rounds: int = 4,
        mask_truncated: bool = False,
        importance_sampling: Literal["token", "sequence"] = "token",
        **kwargs: Any,
    ) -> None:
        super().__init__(temperature=temperature, **kwargs)
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (advantages are relative to the group), got {num_generations}")
        if advantage not in ADVANTAGES:
            raise ValueError(f"advantage must be one of {ADVANTAGES}, got {advantage!r}")
        if importance_sampling not in ("token", "sequence"):
            raise ValueError(f"importance_sampling must be 'token' or 'sequence', got {importance_sampling!r}")
        if importance_sampling == "sequence" and advantage.startswith("reinforce_pp"):
            raise ValueError("importance_sampling 'sequence' (GSPO) needs one advantage per sequence; "
                             f"advantage {advantage!r} gives one per token")
        if importance_sampling == "sequence" and kwargs.get("tis_cap") is not None:
            raise ValueError("tis_cap weights tokens; importance_sampling 'sequence' (GSPO) has one ratio per "
                             "sequence: use importance_sampling 'token' with tis_cap")
        if max_sampling_rounds < 1:
            raise ValueError(f"max_sampling_rounds must be >= 1, got {max_sampling_rounds}")
        if scale not in ("group", "batch", "none"):
            raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
        if aggregation not in ("token_mean", "sequence_mean", "constant_normalizer"):
            raise ValueError(f"aggregation must be 'token_mean', 'sequence_mean' or 'constant_normalizer', got {aggregation!r}")
        if num_iterations < 1 or num_minibatches < 1:
            raise ValueError(f"num_iterations and num_minibatches must be >= 1, got {num_iterations} and {num_minibatches}")
        # the settings, read at run time (`lit_rlhf.modules.settings`)
        self.num_generations, self.advantage, self.scale, self.eps = num_generations, advantage, scale, eps
        self.clip_eps_low, self.clip_eps_high, self.aggregation = clip_eps_low, clip_eps_high, aggregation
        self.num_iterations, self.num_minibatches = num_iterations, num_minibatches
        self.dynamic_sampling, self.max_sampling_rounds = dynamic_sampling, max_sampling_rounds
        self.mask_truncated, self.importance_sampling = mask_truncated, importance_sampling
        self.refill_batches = 0  # prompts batches drawn by dynamic sampling; saved in checkpoints
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
        return self.updates_per_rollout() > 1 or (self._reinforce_pp and self.kl_coef > 0)

    @property
    def _reinforce_pp(self) -> bool:
        return self.advantage in ("reinforce_pp", "reinforce_pp_baseline")

    def collect_rollout(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        if self.dynamic_sampling:
            return dynamic_sample(self, batch)
        return super().collect_rollout(batch)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[CHECKPOINT_KEY]["refill_batches"] = self.refill_batches

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.refill_batches = int(checkpoint.get(CHECKPOINT_KEY, {}).get("refill_batches", 0))

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        group = self.num_generations
        scores = rollout.scores.float()  # (B*G,)
        mask, attention = rollout.loss_mask, rollout.response_mask  # (B*G, R): the policy's tokens, every token
        token_advantages = None
        if self._reinforce_pp:  # per-token, normalised over every rank's tokens
            token_advantages = reinforce_pp_advantages(
                scores, mask, rollout.logps, rollout.ref_logps, self.kl_coef,
                group if self.advantage == "reinforce_pp_baseline" else None,
            )  # (B*G, R)
            (everyone, own), (everyone_mask, _) = gather_rows(token_advantages), gather_rows(mask)
            token_advantages = normalize_token_advantages(everyone, everyone_mask)[own]
            advantages = token_advantages.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B*G,) for the stats
        elif self.advantage == "rloo":
            advantages = rloo_advantages(scores, group)  # (B*G,)
        elif self.scale == "batch":  # the std of the GLOBAL batch: every rank's rewards, this rank's slice
            everyone, own = gather_rows(scores)  # (W*B*G,)
            advantages = grpo_advantages(everyone, group, self.scale, self.eps)[own]  # (B*G,)
        else:  # groups never straddle ranks (a prompt's G copies are sampled on one rank)
            advantages = grpo_advantages(scores, group, self.scale, self.eps)  # (B*G,)
        grouped = scores.view(-1, group)  # (B, G)
        loss_mask = mask & rollout.has_eos.unsqueeze(1) if self.mask_truncated else mask  # (B*G, R)
        ref_logps = rollout.ref_logps if self.kl_coef > 0 and token_advantages is None else None
        sequence_level = self.importance_sampling == "sequence"
        on_policy = rollout.logps is None
        filled = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device) if on_policy else None  # (B*G, R)

        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            logps = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                attention[rows], self.logprob_temperature, groups=rows // group,
            )  # (n, R); a group's rows in this micro-batch share one prompt computation
            if on_policy:
                filled[rows] = torch.where(mask[rows], logps.detach().float(), 0.0)  # 0 off the policy's tokens
            old = None if on_policy else rollout.logps[rows]
            ref = None if ref_logps is None else ref_logps[rows]
            tis = self.tis_weights(rollout, rows, logps.detach() if on_policy else old)  # (n, R) or None
            if token_advantages is not None:  # REINFORCE++: the KL is already in the advantages
                token_adv = token_advantages[rows] if tis is None else token_advantages[rows] * tis
                out = clipped_token_loss(logps, old, token_adv, loss_mask[rows], self.clip_eps_low, self.clip_eps_high)
            elif sequence_level:  # GSPO
                out = gspo_policy_loss(logps, old, ref, advantages[rows], loss_mask[rows], self.clip_eps_low,
                                       self.clip_eps_high, self.kl_coef)
            else:
                out = grpo_policy_loss(
                    logps, old, ref, advantages[rows], loss_mask[rows],
                    self.clip_eps_low, self.clip_eps_high, self.kl_coef, self.aggregation, max_completion_length=mask.shape[1],
                    token_weights=tis,
                )
            return out.loss, {
                "loss/total": out.loss.detach(),
                "policy/loss": out.policy_loss,
                "policy/clipfrac": out.clipfrac,
                "policy/clipfrac_low": out.clipfrac_low,
                "policy/clipfrac_high": out.clipfrac_high,
                "policy/ratio_mean": out.ratio_mean,
                "objective/kl_loss": out.kl,
            }

        # a token mean over the whole minibatch (all ranks), whatever micro_batch_size: each
        # micro-batch weighs its share of the loss's tokens (`run_updates`; REINFORCE++'s loss is
        # a token mean too); GSPO and the other aggregations are per-sequence (sequence_mean) or
        # per-row constant (constant_normalizer): a share of rows
        token_mean = token_advantages is not None or (self.aggregation == "token_mean" and not sequence_level)
        tokens = loss_mask.sum(dim=1).float() if token_mean else None  # (B*G,)
        stats = self.run_updates(mask.shape[0], self.num_iterations, self.num_minibatches, loss_fn, row_weights=tokens)
        stats["rewards/group_std"] = grouped.std(dim=1).mean()
        stats["rewards/zero_std_fraction"] = (grouped == grouped[:, :1]).all(dim=1).float().mean()
        stats["advantages/abs_mean"] = advantages.abs().mean()
        return (rollout._replace(logps=filled) if on_policy else rollout), stats
