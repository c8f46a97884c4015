"""One rollout of an online module, and the statistics a training step logs of it.

A training step's rollout (`OnlineModule`, `lit_rlhf.modules.online`, calls these with itself as
`module`):

1. **sample**: the rollout source (`rollout`, a `lit_rlhf.online` object: `HFSampler` by default,
   `VLLMSampler`, `AsyncRollouts`, `EnvironmentRollouts`) gives `repeats` responses per prompt
   (a prompt's copies contiguous), `max_new_tokens` each, cut after the first EOS and PAD-filled
   (D23);
2. **score once**, without grad, in micro-batches of `micro_batch_size` rows: the policy's
   log-probs of the sampled tokens (the "old" ones; skipped when the update is on-policy,
   `needs_rollout_logps`), the reference's (when there is one), PPO's values; all at
   `logprob_temperature` (the sampling temperature unless set apart: one temperature, D-temp);
3. **reward**: every reward source (`lit_rlhf.online.scoring`), then the method's own per-row
   data (`rollout_extras`), then the callbacks' rollout hook (`lit_rlhf.online.hooks`).

- `make_rollout`: steps 1 and 2 and the reward sources; `training_rollout`: one round of a
  training step's sampling, all three steps; `greedy_rollout`: each prompt's greedy response,
  scored and shaped the same way (ReMax's baseline);
- `step_stats`: what a training step logs of its rollout, added to the update's statistics;
  `validation_stats`: what a validation step logs of its one response per prompt.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.generation import SamplingConfig
from lit_rlhf.lightning_compat import attached_trainer
from lit_rlhf.online import hooks, scoring
from lit_rlhf.online.correction import correction_stats
from lit_rlhf.online.environment import episode_stats
from lit_rlhf.ops import masked_sum
from lit_rlhf.types import PromptBatch, Rollout, padding_fraction


def training_rollout(module: Any, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
    """One round of a training step's sampling: `make_rollout` (`repeats` responses per prompt,
    log-probs when `needs_rollout_logps`), the method's `rollout_extras`, the rollout hooks
    -> (rollout, each source's rewards, sampling stats)."""
    rollout, per_source, stats = module.make_rollout(batch, module.repeats, with_logps=module.needs_rollout_logps)
    extras = module.rollout_extras(batch, rollout)
    if extras:
        rollout = rollout.with_extras(**extras)
    rollout = hooks.apply_rollout_hooks(attached_trainer(module), module, rollout)
    return rollout, per_source, stats


def make_rollout(module: Any, batch: PromptBatch, repeats: int = 1, with_logps: bool = True,
                 sampling: SamplingConfig | None = None) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
    """Sample (the rollout source), score once (old and reference log-probs, values) and reward,
    without grad -> (rollout with its unshaped scores, each source's (N,) rewards, the source's
    sampling stats). `sampling` None: the training sampling, else validation."""
    source = module.rollout_source
    rollout, stats = source.sample(module, batch, repeats, sampling or module.sampling, training=sampling is None)
    # a prompt's copies share one prompt computation (`shared_prompt`)
    groups = torch.arange(rollout.num_rows, device=rollout.prompt_ids.device) // repeats if repeats > 1 else None
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_attention_mask)
    micro, temperature, ref = module.micro_batch_size, module.logprob_temperature, getattr(module, "ref_model", None)
    with torch.no_grad():
        logps = module.response_token_logps(module.policy, *args, temperature, micro, groups) if with_logps else None
        ref_logps = None if ref is None else module.response_token_logps(ref, *args, temperature, micro, groups)
        rollout = rollout._replace(logps=rollout.on_policy_tokens(logps), ref_logps=rollout.on_policy_tokens(ref_logps))
        values = module.rollout_values(rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1])
    rollout = rollout._replace(values=values)
    scores, per_source = scoring.score_rollout(module, rollout, repeats)
    module.check_finite(batch, scores=scores, values=values)
    return rollout.with_scores(scores), per_source, stats


def greedy_rollout(module: Any, batch: PromptBatch) -> Rollout:
    """Each prompt's greedy response (B rows, `do_sample` off, the same sampler), scored and
    shaped by the rollout hooks as the samples are; no log-probs. ReMax's baseline."""
    prompt_ids, prompt_mask = batch.input_ids, batch.attention_mask.bool()  # (B, P)
    ids, mask, has_eos, _ = module.generate(prompt_ids, prompt_mask, dataclasses.replace(module.sampling, do_sample=False))
    rollout = Rollout(prompt_ids, prompt_mask, ids, mask, has_eos, None, meta=dict(batch.meta))
    scores, _ = scoring.score_rollout(module, rollout)
    module.check_finite(batch, scores=scores)
    return hooks.apply_rollout_hooks(attached_trainer(module), module, rollout.with_scores(scores))


def step_stats(module: Any, stats: dict[str, Tensor], rollout: Rollout, per_source: dict[str, Tensor],
               sampling_stats: dict[str, Tensor], started: float, generated: float,
               updated: float) -> dict[str, Tensor]:
    """The update's `stats` with what a training step logs of its rollout: the objective
    (`scoring.rollout_stats`), the source's correction, episodes, sampling, each reward source,
    times and throughput, padding."""
    same_temperature = module.logprob_temperature == module.sampling.temperature  # sampler logps comparable
    stats.update(scoring.rollout_stats(rollout, module.kl_coef, same_temperature))
    stats.update(correction_stats(rollout, module.rollout_source.correction) if same_temperature else {})
    stats.update(episode_stats(rollout))
    stats.update(sampling_stats)
    stats.update({f"rewards/{name}": r.float().mean() for name, r in per_source.items()})
    stats["time/generation"] = torch.tensor(generated - started)
    stats["time/update"] = torch.tensor(updated - generated)
    stats["perf/tokens_per_sec"] = rollout.attention_mask.sum().float() / max(updated - started, 1e-9)
    stats["data/padding_fraction"] = torch.tensor(padding_fraction(rollout))  # prompt and response PAD
    stats["objective/episodes"] = torch.tensor(float(module.episodes))
    if "time/rollout_wait" in stats:  # the share of the step the learner waited for its batch
        stats["perf/trainer_idle_fraction"] = stats["time/rollout_wait"] / max(updated - started, 1e-9)
    return stats


def validation_stats(rollout: Rollout) -> dict[str, Tensor]:
    """A validation rollout's unshaped scores, lengths, EOS fraction, episodes and, with the
    reference's and the policy's log-probs, the KL."""
    stats = {
        "objective/scores": rollout.scores.float().mean(),
        "response/length": rollout.loss_mask.sum(dim=1).float().mean(),
        "response/eos_fraction": rollout.has_eos.float().mean(),
    }
    if rollout.ref_logps is not None and rollout.logps is not None:
        stats["objective/kl"] = masked_sum(rollout.logps - rollout.ref_logps, rollout.loss_mask, dim=1).mean()
    stats.update(episode_stats(rollout))
    return stats
