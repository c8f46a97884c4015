"""On-policy distillation: the student samples, and each of its tokens is pulled toward a teacher."""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

import torch
from torch import Tensor

from lit_rlhf import models
from lit_rlhf.losses import ChunkedGKDOutput, GKDLossOutput, chunked_gkd_loss, distillation_pg_loss, gkd_loss, grpo_advantages
from lit_rlhf.models import adapters
from lit_rlhf.models.distillation import response_hidden, response_vocab_logps, tokenizer_differences, with_context
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.online.fixed import reference_rollout
from lit_rlhf.ops import masked_sum
from lit_rlhf.rng import validation_rng
from lit_rlhf.types import PromptBatch, Rollout

log = logging.getLogger(__name__)

DistillationLoss = Literal["reverse_kl_pg", "gkd"]
BASE = "base"  # `teacher: base`: the student's own starting weights (with LoRA: the base, adapter off)


class DistillationModule(OnlineModule):
    """On-policy distillation (Agarwal et al. 2024, GKD; Thinking Machines, "On-Policy
    Distillation", 2025; Qwen3 technical report, Sec. 4.5).

    Each step samples `num_generations` responses per prompt from the student, scores them with
    the reward sources, and takes one step on `loss` (docs/methods/distillation.md): `reverse_kl_pg`,
    REINFORCE with the per-token advantage -(log pi_s - log pi_t) discounted by `gamma`
    (`losses.distillation_pg_loss`), or `gkd`, GKD's generalized JSD between the two models'
    next-token distributions (`losses.chunked_gkd_loss`, a chunk of tokens at a time); plus
    `reward_weight` times the task reward's group-centred advantage and a k1 penalty `kl_coef`.
    Every log-prob is at `logprob_temperature`; the loss is a token mean over the rollout. Logs
    `distill/reverse_kl`, `distill/divergence`, `distill/teacher_tail_mass`, `advantages/mean`,
    `loss/total`; validation `distill/reverse_kl`.

    Args:
        teacher: a model name or directory (like `ref_model`), loaded frozen, never checkpointed,
            sharing the student's tokenizer (checked); or `base`: the student's starting weights
            (with LoRA the base with the adapter off, no copy), which needs `teacher_context`.
        teacher_context: text whose tokens are put before the teacher's prompt only: a privileged
            context the student never sees (context distillation, Snell et al. 2022). For chat
            prompts write it as a whole turn (`<|im_start|>system\\n...<|im_end|>\\n`).
        loss: `reverse_kl_pg` (the sampled policy-gradient form) or `gkd` (the supervised form).
        beta: `gkd`'s generalized JSD coefficient (0 forward KL, 1 reverse KL); GKD's default 0.5.
        teacher_top_k: `gkd` over the teacher's k most likely tokens plus one tail bucket (not the
            sampler's `top_k`); None = the full vocabulary.
        gamma: `reverse_kl_pg`'s discount of later tokens' -KL in the advantage (0: each token's own).
        lmbda: GKD's fraction of on-policy batches (Sec. 3.2): each step is sampled by the
            student with probability lmbda, else trained on the batch's `reference` completions
            (`distill/on_policy` says which; the draw depends on the seed and the rollout count
            only). Below 1 with `loss: gkd` only, no task reward and no reference penalty.
        reward_weight: weight of the task reward (the reward sources) in the advantage; 0 = pure
            distillation (then no reward source is needed).
        kl_coef: the k1 penalty to the reference per token (0: no reference is loaded).
        num_generations: responses per prompt (>= 2 when `reward_weight` > 0: the group baseline).
        temperature: sampling temperature, also the log-prob temperature unless set apart.
        **kwargs: `OnlineModule` (reward sources, reference, sampling, micro_batch_size,
            max_grad_norm, total_episodes, completion logging) and `PolicyModule` (model, LoRA, ...).
    """

    reward_optional = True  # reward_weight 0: pure distillation, no reward source needed
    supports_tis = True  # the rollout correction weighs the policy-gradient terms, not GKD's divergence

    def __init__(
        self,
        teacher: str = BASE,
        teacher_context: str | None = None,
        loss: DistillationLoss = "reverse_kl_pg",
        beta: float = 0.5,
        teacher_top_k: int | None = None,
        gamma: float = 0.0,
        lmbda: float = 1.0,
        reward_weight: float = 0.0,
        kl_coef: float = 0.0,
        num_generations: int = 1,
        temperature: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if loss not in ("reverse_kl_pg", "gkd"):
            raise ValueError(f"loss must be 'reverse_kl_pg' or 'gkd', got {loss!r}")
        if not 0.0 <= lmbda <= 1.0:
            raise ValueError(f"lmbda must be in [0, 1], got {lmbda}")
        if lmbda < 1.0 and (loss != "gkd" or reward_weight or kl_coef):
            raise ValueError(f"lmbda={lmbda} trains on fixed completions too: it needs loss 'gkd', reward_weight 0 and "
                             "kl_coef 0 (the policy-gradient terms are correct on the student's own samples only)")
        if not 0.0 <= beta <= 1.0 or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"beta and gamma must be in [0, 1], got {beta} and {gamma}")
        if teacher_top_k is not None and (teacher_top_k < 1 or loss != "gkd"):
            raise ValueError(f"teacher_top_k must be >= 1 and is a setting of loss 'gkd', got {teacher_top_k} with {loss!r}")
        if gamma and loss != "reverse_kl_pg":
            raise ValueError(f"gamma discounts the policy-gradient form's advantage: loss 'reverse_kl_pg', not {loss!r}")
        if reward_weight < 0 or num_generations < 1:
            raise ValueError(f"reward_weight must be >= 0 and num_generations >= 1, got {reward_weight}, {num_generations}")
        if reward_weight > 0 and num_generations < 2:
            raise ValueError(f"reward_weight {reward_weight} needs num_generations >= 2: the task reward's advantage is "
                             "centred on the prompt's group")
        if teacher == BASE and not teacher_context:
            raise ValueError("teacher 'base' without teacher_context is the student itself at step 0: nothing to "
                             "distil; give teacher_context (a privileged prompt) or a teacher model")
        super().__init__(temperature=temperature, **kwargs)
        if getattr(self.rollout_source.correction, "offpolicy_kl", None) is not None:
            raise ValueError("DistillationModule: the off-policy sequence mask (correction.offpolicy_kl) reads a "
                             "sequence advantage the distillation losses do not have: leave it null")
        if reward_weight > 0 and self.reward_model_name is None and not self.reward_fns and not self.rollout_source.multi_turn:
            raise ValueError(f"reward_weight {reward_weight} weighs the task reward, but no reward source is set: set "
                             "reward_model and/or reward_fns, or reward_weight 0 (pure distillation)")
        # the settings, read at run time (`lit_rlhf.training.settings`)
        self.teacher_name, self.teacher_context, self.loss = teacher, teacher_context, loss
        self.beta, self.teacher_top_k, self.gamma, self.lmbda = beta, teacher_top_k, gamma, lmbda
        self.lmbda_seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # the on/off-policy draws' seed
        self.reward_weight, self.num_generations = reward_weight, num_generations
        self.teacher_context_ids: list[int] = (
            self.tokenizer(teacher_context, add_special_tokens=False)["input_ids"] if teacher_context else [])
        self.load_teacher(teacher)
        self.init_kl(kl_coef)
        # each validation's `distill/reverse_kl` (step, value), for the fit's closing line (`on_fit_end`)
        self.val_reverse_kl: list[tuple[int, float]] = []
        self._val_kl_sum, self._val_kl_rows = 0.0, 0

    def load_teacher(self, name: str) -> None:
        """`self.teacher_model`: frozen, out of checkpoints, or a view of the shared base."""
        if name == BASE and self.lora_config is not None:
            object.__setattr__(self, "teacher_model", adapters.AdapterView(self.policy, None))  # owns no weights
            return
        if name == BASE:
            self.add_frozen("teacher_model", models.frozen_copy(self.policy))
            return
        differences = tokenizer_differences(self.tokenizer, models.load_tokenizer(name))
        if differences:
            raise ValueError(f"teacher {name!r} does not share the student's tokenizer ({self.tokenizer_name!r}): "
                             f"{'; '.join(differences)}. Distillation compares the two models token by token: "
                             "give a teacher with the student's tokenizer")
        self.add_frozen("teacher_model", models.load_reference_model(name, self.tokenizer, self.model_dtype))

    @property
    def learns_from_scores(self) -> bool:
        """Whether the update reads the task reward (`callbacks.RunHealthCallback` asks)."""
        return self.reward_weight > 0

    @property
    def repeats(self) -> int:
        return self.num_generations

    @property
    def needs_rollout_logps(self) -> bool:
        return False  # one on-policy step: the update's own log-probs

    def collect_rollout(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """The student's samples with probability `lmbda`, else the batch's fixed completions."""
        if self.lmbda == 1.0:
            return super().collect_rollout(batch)
        draw = torch.Generator().manual_seed(hash((self.lmbda_seed, self.rollouts)) & (2**63 - 1))
        if bool(torch.rand((), generator=draw) < self.lmbda):
            rollout, per_source, stats = super().collect_rollout(batch)
            return rollout, per_source, {**stats, "distill/on_policy": torch.tensor(1.0)}
        rollout = reference_rollout(batch, self.tokenizer, self.repeats, self.sampling.max_new_tokens)
        scores, per_source = self.score(rollout, self.repeats)
        rollout = self.shape(rollout.with_scores(scores))
        return rollout, per_source, {"distill/on_policy": torch.tensor(0.0)}

    def teacher_prompts(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """The teacher's prompts (N, P + C): `teacher_context`'s tokens, then each prompt."""
        return with_context(rollout.prompt_ids, rollout.prompt_mask, self.teacher_context_ids, self.tokenizer.pad_token_id)

    @torch.no_grad()
    def teacher_token_logps(self, rollout: Rollout, repeats: int) -> Tensor:
        """The teacher's log-probs (N, R) of the sampled tokens, on its own prompts (`repeats` rows
        per prompt share its computation); 0 off `loss_mask`."""
        groups = torch.arange(rollout.num_rows, device=rollout.prompt_ids.device) // repeats if repeats > 1 else None
        prompt_ids, prompt_mask = self.teacher_prompts(rollout)
        logps = self.response_token_logps(self.teacher_model, prompt_ids, prompt_mask, rollout.response_ids,
                                          rollout.response_attention_mask, self.logprob_temperature,
                                          self.micro_batch_size, groups)
        return torch.where(rollout.loss_mask, logps, 0.0)

    def rollout_extras(self, batch: PromptBatch, rollout: Rollout) -> dict[str, Tensor]:
        return {"teacher_logps": self.teacher_token_logps(rollout, self.repeats)} if self.loss == "reverse_kl_pg" else {}

    def task_advantages(self, rollout: Rollout) -> Tensor | None:
        """(N,) r - mean over the prompt's group of the task reward; None without `reward_weight`."""
        if not self.reward_weight:
            return None
        return grpo_advantages(rollout.scores.float(), self.num_generations, "none", 0.0)

    def gkd_terms(self, args: tuple[Tensor, ...], teacher_ids: Tensor, teacher_mask: Tensor,
                  mask: Tensor) -> tuple[GKDLossOutput | ChunkedGKDOutput, Tensor, Tensor]:
        """GKD's divergence on these rows, and the student's and the teacher's log-probs (n, R) of
        the sampled tokens: chunked from the hidden states (`chunked_gkd_loss`) where
        `logprob_chunk_size` and both models allow, else from the (n, R, V) log-probs."""
        chunk = self.logprob_chunk_size
        student = response_hidden(self.policy, *args) if chunk else None
        with torch.no_grad():
            teacher = None if student is None else response_hidden(self.teacher_model, teacher_ids, teacher_mask,
                                                                   args[2], args[3])
        if student is not None and teacher is not None:
            (hidden, head), (teacher_hidden, teacher_head) = student, teacher
            out = chunked_gkd_loss(hidden, head.weight, head.bias, teacher_hidden, teacher_head.weight, teacher_head.bias,
                                   args[2], mask, self.beta, self.logprob_temperature, chunk, self.teacher_top_k)
            return out, out.student_logps, out.teacher_logps
        student_logps = response_vocab_logps(self.policy, *args, self.logprob_temperature)  # (n, R, V)
        with torch.no_grad():
            teacher_logps = response_vocab_logps(self.teacher_model, teacher_ids, teacher_mask, args[2], args[3],
                                                 self.logprob_temperature)  # (n, R, V)
        top = teacher_logps.topk(self.teacher_top_k, dim=-1) if self.teacher_top_k else None
        out = gkd_loss(student_logps, teacher_logps if top is None else top.values, mask, self.beta,
                       None if top is None else top.indices)
        sampled = args[2][..., None]
        return out, student_logps.gather(-1, sampled).squeeze(-1), teacher_logps.gather(-1, sampled).squeeze(-1)

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        mask, attention = rollout.loss_mask, rollout.response_attention_mask  # (N, R)
        task = self.task_advantages(rollout)  # (N,) or None
        ref = rollout.ref_logps if self.kl_coef > 0 else None
        teacher_ids, teacher_mask = self.teacher_prompts(rollout) if self.loss == "gkd" else (None, None)
        filled = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # the update's own log-probs
        group = self.num_generations

        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            args = (rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows], attention[rows])
            stats: dict[str, Tensor] = {}
            if self.loss == "gkd":
                out, logps, picked = self.gkd_terms(args, teacher_ids[rows], teacher_mask[rows], mask[rows])
                stats.update({"distill/divergence": out.loss.detach(), "distill/reverse_kl":
                              masked_sum(logps.detach() - picked, mask[rows]) / mask[rows].sum().clamp(min=1)})
                if self.teacher_top_k:
                    stats["distill/teacher_tail_mass"] = out.tail_mass
                loss = out.loss
                teacher_logps = None  # the task reward and the reference penalty only, below
            else:
                logps = self.response_token_logps(self.policy, *args, self.logprob_temperature, groups=rows // group)
                loss, teacher_logps = 0.0, rollout.extras["teacher_logps"][rows]
            filled[rows] = torch.where(mask[rows], logps.detach().float(), 0.0)
            if teacher_logps is not None or task is not None or ref is not None:
                pg = distillation_pg_loss(logps, teacher_logps, mask[rows], self.gamma,
                                          None if task is None else task[rows], self.reward_weight,
                                          None if ref is None else ref[rows], self.kl_coef,
                                          self.tis_weights(rollout, rows, logps.detach()))
                loss = loss + pg.loss
                stats["advantages/mean"] = pg.advantage_mean
                if teacher_logps is not None:
                    stats["distill/reverse_kl"] = pg.reverse_kl
            stats["loss/total"] = loss.detach()
            return loss, stats

        tokens = mask.sum(dim=1).float()  # (N,): a token mean over the whole rollout, whatever micro_batch_size
        stats = self.run_updates(mask.shape[0], 1, 1, loss_fn, row_weights=tokens)
        return rollout._replace(logps=filled), stats

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        """One response per prompt (`val_sampling`): scores, lengths, EOS fraction, `distill/reverse_kl`."""
        with validation_rng(self.device, self.global_step, batch_idx):
            rollout, _, _ = self.make_rollout(batch, 1, with_logps=True, sampling=self.val_sampling)
        mask = rollout.loss_mask
        teacher = self.teacher_token_logps(rollout, 1)
        stats = {
            "objective/scores": rollout.scores.float().mean(),
            "response/length": mask.sum(dim=1).float().mean(),
            "response/eos_fraction": rollout.has_eos.float().mean(),
            "distill/reverse_kl": masked_sum(rollout.logps - teacher, mask) / mask.sum().clamp(min=1),
        }
        self._val_kl_sum += float(stats["distill/reverse_kl"]) * rollout.num_rows  # the logged epoch mean's weights
        self._val_kl_rows += rollout.num_rows
        if rollout.ref_logps is not None:
            stats["objective/kl"] = masked_sum(rollout.logps - rollout.ref_logps, mask, dim=1).mean()
        self.log_stats("val", stats, batch_size=rollout.num_rows)

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self._val_kl_sum, self._val_kl_rows = 0.0, 0

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self._val_kl_rows:  # this rank's mean over the validation's rows, as the logged value weighs them
            self.val_reverse_kl.append((self.global_step, self._val_kl_sum / self._val_kl_rows))

    def on_fit_end(self) -> None:
        """The fit's result line: the first and the last validation reverse KL."""
        trainer = self.attached_trainer
        if trainer is not None and trainer.is_global_zero and self.val_reverse_kl:
            (first_step, first), (last_step, last) = self.val_reverse_kl[0], self.val_reverse_kl[-1]
            log.warning("distillation result: val/distill/reverse_kl %.4g (step %d) -> %.4g (step %d), %d validations",
                        first, first_step, last, last_step, len(self.val_reverse_kl))
        super().on_fit_end()
