"""PPO for RLHF with in-loop generation (N+ implementation details, `docs/ARCHITECTURE.md` D21-D25)."""

from __future__ import annotations

from typing import Any, Iterator, Literal

import torch
from torch import Tensor

from lit_rlhf.distributed import global_masked_whiten
from lit_rlhf.losses import ppo_policy_loss, ppo_rewards, ppo_value_loss
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.ops import gae, masked_sum
from lit_rlhf.types import Rollout


class PPOModule(OnlineModule):
    """PPO with a policy, a value model, a frozen reference and reward sources (N+ Table 7).

    Each training step takes one PromptBatch from the prompt loader (reshuffled every epoch,
    D21) and:

    1. samples `max_new_tokens` tokens per prompt at `temperature` (0.7 for TL;DR) and scores
       them once: old log-probs and reference log-probs under that temperature, values, scores
       (`OnlineModule.make_rollout`, from its rollout source); callbacks then shape the scores through the rollout hook
       (e.g. `callbacks.EOSTrickCallback`, D23; `callbacks.KLControlCallback` adapts `kl_coef`);
    2. per-token rewards `-kl_coef * kl_t` with the score added on the EOS token, the last
       response token (`losses.ppo_rewards`, D12), optionally whitened without shifting the
       mean (D24, off by default); GAE with `gamma`, `lam` -> advantages (B, R) and returns;
       advantages whitened over the rollout (D25); both whitenings use the moments of the
       global rollout, every rank's tokens (`lit_rlhf.distributed.global_masked_whiten`);
    3. `ppo_epochs` passes over `num_minibatches` minibatches, gradient accumulation over
       `micro_batch_size` rows: loss = clipped policy loss + `value_coef` * clipped value loss,
       both token means over the minibatch's response tokens (all ranks, whatever the micro-batching),
       gradients clipped to `max_grad_norm`, one optimizer step per minibatch. The first pass
       keeps the rollout's row order, so its first ratio is exactly 1 (D7).

    The value of the state before response token t is the value model's output at position
    P - 1 + t (the token before it), so values (B, R) line up with the per-token rewards.
    Policy and value are in ONE AdamW optimizer, two parameter groups (plus no-decay groups).

    Logged every step (`train/...`): `objective/{scores,kl,entropy,rlhf_reward,
    non_score_reward,episodes}`, `policy/{loss,clipfrac,approxkl,ratio_mean,ratio_var,
    first_ratio_mean}`, `value/{loss,vpred,error,clipfrac}` (the value model's stats go under
    `train/value/`, not `val/`, which is the validation stage), `response/{length,eos_fraction}`,
    `rewards/<source>`, `time/{generation,update}`, `perf/tokens_per_sec`; sample completions
    as TensorBoard text every `log_completions_every_n_steps` rollouts.

    Args:
        value_model: the value model's initial weights (D22); None = the reward model (or, when
            there is none, the policy's backbone with a fresh D11 head).
            `gradient_checkpointing` applies to it as to the policy (a LoRA value adapter on the
            policy's base is checkpointed with the policy; one on a separate reward model's body
            checkpoints that body).
        value_lr: learning rate of the value model; None = `lr`.
        kl_coef: the KL penalty coefficient, beta in Ziegler et al. (0.05, N+ Table 7); adapted by
            `KLControlCallback`.
        kl_estimator: per-token KL estimator of the penalty: `k1` (log pi - log pi_ref, N+) or `k3`.
        gamma: GAE discount (1.0).
        lam: GAE lambda (0.95).
        whiten_rewards: whiten the per-token rewards before GAE (D24, off).
        whiten_advantages: whiten the advantages over the rollout (D25, on).
        clip_eps: policy ratio clip range (0.2).
        value_clip_eps: value clip range (0.2).
        value_coef: weight of the value loss (0.1).
        ppo_epochs: passes over each rollout (K = 4).
        num_minibatches: minibatches per pass; one optimizer step each.
        lr: peak learning rate (3e-6, N+ Table 7).
        adam_eps: AdamW epsilon (1e-5, N+ Table 7).
        temperature: sampling temperature, also dividing the logits of every log-prob unless
            `logprob_temperature` is set apart (0.7: the N+ TL;DR recipe samples its PPO rollouts
            at 0.7 and scores them at 0.7).
        **kwargs: `OnlineModule` (reward sources, reference, sampling, micro_batch_size,
            max_grad_norm, total_episodes, completion logging) and `PolicyModule` (model,
            tokenizer, dtype, optimiser and schedule, export).
    """

    supports_tis = True
    accepts_environment = True

    def __init__(
        self,
        value_model: str | None = None,
        value_lr: float | None = None,
        kl_coef: float = 0.05,
        kl_estimator: Literal["k1", "k3"] = "k1",
        gamma: float = 1.0,
        lam: float = 0.95,
        whiten_rewards: bool = False,
        whiten_advantages: bool = True,
        clip_eps: float = 0.2,
        value_clip_eps: float = 0.2,
        value_coef: float = 0.1,
        ppo_epochs: int = 4,
        num_minibatches: int = 1,
        lr: float = 3e-6,
        adam_eps: float = 1e-5,
        temperature: float = 0.7,
        **kwargs: Any,
    ) -> None:
        super().__init__(lr=lr, adam_eps=adam_eps, temperature=temperature, **kwargs)
        if ppo_epochs < 1 or num_minibatches < 1:
            raise ValueError(f"ppo_epochs and num_minibatches must be >= 1, got {ppo_epochs} and {num_minibatches}")
        if kl_estimator not in ("k1", "k3"):
            raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {kl_estimator!r}")
        # the settings, read at run time (`lit_rlhf.training.settings`)
        self.value_lr, self.kl_estimator, self.gamma, self.lam = value_lr, kl_estimator, gamma, lam
        self.whiten_rewards, self.whiten_advantages = whiten_rewards, whiten_advantages
        self.clip_eps, self.value_clip_eps, self.value_coef = clip_eps, value_clip_eps, value_coef
        self.ppo_epochs, self.num_minibatches = ppo_epochs, num_minibatches
        self.load_reference(self.ref_model_name, self.model_dtype)
        self.set_kl_coef(kl_coef)
        self.value_model = self.load_value_model(value_model or self.reward_model_name)

    def updates_per_rollout(self) -> int:
        return self.ppo_epochs * self.num_minibatches

    def optimizer_param_groups(self) -> list[dict[str, Any]]:
        return self.policy_and_value_groups(self.value_model, self.value_lr or self.lr)

    def rollout_values(self, input_ids: Tensor, attention_mask: Tensor, response_length: int) -> Tensor:
        """V(prompt + response[:t]) for t < R: the value head at positions P-1 ... P+R-2 -> (N, R)."""
        size = self.micro_batch_size or input_ids.shape[0]
        chunks = [
            self.value_model(input_ids[i: i + size], attention_mask[i: i + size]) for i in range(0, input_ids.shape[0], size)
        ]
        full = torch.cat(chunks).float()  # (N, P+R)
        return full[:, -response_length - 1: -1]  # (N, R)

    def turn_rewards(self, rollout: Rollout) -> Tensor | None:
        """The environment's per-turn rewards (N, R) as they weigh in the score: times the
        environment source's weight (`reward_weights`, the last source). None for a one-turn
        rollout, and under `reward_normalization` (the source is then z-scored as a whole, so
        the whole score goes on the last token)."""
        if rollout.turn_rewards is None or self.reward_normalization != "none":
            return None
        weight = 1.0 if self.reward_weights is None else float(self.reward_weights[-1])
        return rollout.turn_rewards.float() * weight

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        mask, attention = rollout.loss_mask, rollout.response_attention_mask  # (N, R): the policy's tokens, every token
        # 1. per-token rewards: KL penalty everywhere, the score on the EOS token (D12); a
        # multi-turn episode's environment rewards on the turns that earned them
        shaped = ppo_rewards(rollout.scores, rollout.logps, rollout.ref_logps, mask, self.kl_coef, self.kl_estimator,
                             self.turn_rewards(rollout))
        # whitening moments over the global rollout, every rank's tokens (lit_rlhf.distributed)
        rewards = global_masked_whiten(shaped.rewards, mask, shift_mean=False) if self.whiten_rewards else shaped.rewards  # D24
        # 2. GAE, then advantage whitening over the whole rollout (D25)
        advantages, returns = gae(rewards, rollout.values, mask, self.gamma, self.lam)  # (N, R) each
        if self.whiten_advantages:
            advantages = global_masked_whiten(advantages, mask)
        response_length = mask.shape[1]
        input_ids, attention_mask = rollout.input_ids, rollout.attention_mask

        # 3. K epochs of clipped policy + value updates: the policy and value networks train
        # disjoint parameters, so the policy term's backward pass runs first and frees the
        # policy's activations before the value model's forward pass (run_updates: loss parts)
        def loss_fn(rows: Tensor) -> Iterator[tuple[Tensor, dict[str, Tensor]]]:
            logps = self.response_token_logps(
                self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                attention[rows], self.logprob_temperature,
            )  # (n, R)
            tis = self.tis_weights(rollout, rows, rollout.logps[rows], advantages[rows])  # (n, R), None when off
            adv = advantages[rows] if tis is None else advantages[rows] * tis  # w >= 0: weights each token's clipped term
            pg = ppo_policy_loss(logps, rollout.logps[rows], adv, mask[rows], self.clip_eps)
            yield pg.loss, {
                "policy/loss": pg.loss.detach(),
                "policy/clipfrac": pg.clipfrac,
                "policy/approxkl": pg.approxkl,
                "policy/ratio_mean": pg.ratio_mean,
                "policy/ratio_var": pg.ratio_var,
            }
            values = self.value_model(input_ids[rows], attention_mask[rows]).float()[:, -response_length - 1: -1]  # (n, R)
            vf = ppo_value_loss(values, rollout.values[rows], returns[rows], mask[rows], self.value_clip_eps)
            yield self.value_coef * vf.loss, {
                "loss/total": pg.loss.detach() + self.value_coef * vf.loss.detach(),
                "value/loss": vf.loss.detach(),
                "value/vpred": vf.vpred,
                "value/error": vf.error,
                "value/clipfrac": vf.clipfrac,
            }

        # both losses are token means: each micro-batch weighs its share of the minibatch's
        # response tokens (all ranks), so micro_batch_size does not change the gradient
        stats = self.run_updates(mask.shape[0], self.ppo_epochs, self.num_minibatches, loss_fn,
                                 row_weights=mask.sum(dim=1).float())
        stats["objective/non_score_reward"] = (-self.kl_coef * masked_sum(shaped.kl, mask, dim=1)).mean()
        stats["advantages/mean"] = advantages[mask].mean()
        stats["returns/mean"] = returns[mask].mean()
        return rollout, stats
