"""An online rollout's rewards and its objective statistics.

`score_rollout` evaluates every reward source of an online module on a rollout: a reward model
read at the EOS token (D12), reward functions `(prompts, completions, **batch_columns) ->
rewards` and, for episodes, the environment's return (`lit_rlhf.online.environment`), each
normalised as `reward_normalization` says and combined with `reward_weights`
(`lit_rlhf.rewards.combine_rewards`). `rollout_stats` are the `objective/` and `response/`
statistics every online method logs; `completions_table` is the text of the logged samples.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rlhf.generation import decode_responses
from lit_rlhf.online.environment import dropped_rows, log_conversations, trajectories
from lit_rlhf.ops import masked_sum
from lit_rlhf.rewards import call_reward_fn, combine_rewards, function_name, reward_model_scores
from lit_rlhf.types import Rollout


def checked_reward_sources(reward_model: str | None, reward_fns: list | None, reward_weights: list[float] | None,
                           normalization: str, with_environment: bool, required: bool = True) -> list:
    """The reward functions, once the sources add up: one weight each (the reward model first,
    then `reward_fns` in order, then the environment's return), and at least one source unless
    the method trains without (`required` False: every score is then 0)."""
    if normalization not in ("none", "group", "batch"):
        raise ValueError(f"reward_normalization must be 'none', 'group' or 'batch', got {normalization!r}")
    fns = list(reward_fns or [])
    if any(not callable(fn) for fn in fns):
        raise TypeError(f"reward_fns entries must be callables, got {fns!r}")
    n_sources = int(reward_model is not None) + len(fns) + int(with_environment)
    if n_sources == 0 and required:
        raise ValueError("no reward source: set reward_model and/or reward_fns (or run an environment)")
    if reward_weights is not None and len(reward_weights) != n_sources:
        raise ValueError(f"reward_weights has {len(reward_weights)} entries for {n_sources} reward sources "
                         "(the reward model first, then reward_fns in order, then the environment)")
    return fns


def prompt_texts(rollout: Rollout, tokenizer: Any, k: int | None = None) -> list[str]:
    """The rollout's prompts as text: the `prompt` meta column, else decoded."""
    found = rollout.meta.get("prompt")
    if found is not None:
        return list(found[:k])
    return tokenizer.batch_decode([ids[m].tolist() for ids, m in zip(rollout.prompt_ids[:k], rollout.prompt_mask[:k])])


@torch.no_grad()
def score_rollout(module: Any, rollout: Rollout, group_size: int = 1) -> tuple[Tensor, dict[str, Tensor]]:
    """Every reward source of `module` on the rollout -> (weighted score (N,), {source: (N,)}).

    `group_size` rows per prompt (contiguous); `reward_normalization: group` needs >= 2. When
    the module is not training (validation) the raw weighted sum is reported."""
    per_source: dict[str, Tensor] = {}
    if getattr(module, "reward_model", None) is not None:
        shared = group_size > 1 and module.shared_prompt  # a prompt's copies: one prompt computation
        device = rollout.prompt_ids.device
        groups = torch.arange(rollout.prompt_ids.shape[0], device=device) // group_size if shared else None
        per_source["reward_model"] = reward_model_scores(
            module.reward_model, rollout.input_ids, rollout.attention_mask, module.micro_batch_size,
            groups, rollout.prompt_ids.shape[1],
        )
    episodes = trajectories(rollout)
    if module.reward_fns:
        prompts = prompt_texts(rollout, module.tokenizer)
        if episodes is None:
            completions = decode_responses(module.tokenizer, rollout.response_ids, rollout.loss_mask)
        else:  # an episode's answer is its last policy turn
            completions = [t.final_text for t in episodes]
        columns = {
            "completion_length": rollout.loss_mask.sum(dim=1).tolist(),  # the policy's tokens, EOS included
            "truncated": (~rollout.has_eos).tolist(),
            **rollout.meta,
        }
        for fn in module.reward_fns:
            name = function_name(fn)
            while name in per_source:
                name += "_"
            per_source[name] = call_reward_fn(fn, list(prompts), completions, columns)
    if episodes is not None:  # the environment's return, after the other sources
        per_source["environment"] = torch.tensor([t.reward for t in episodes], dtype=torch.float32)
    device = rollout.response_ids.device
    if not per_source:  # a method that trains without a reward source (`OnlineModule.reward_optional`)
        return torch.zeros(rollout.num_rows, device=device), per_source
    per_source = {k: v.to(device) for k, v in per_source.items()}
    dropped = dropped_rows(rollout)  # groups dropped after an environment error: 0 from every source
    if dropped is not None:
        per_source = {k: torch.where(dropped, torch.zeros_like(v), v) for k, v in per_source.items()}
    how = module.reward_normalization if module.training else "none"  # val: raw scores
    if how == "group" and group_size < 2:
        raise ValueError("reward_normalization 'group' needs several samples per prompt (GRPO's "
                         "num_generations); this method samples one: use 'batch' or 'none'")
    return combine_rewards(per_source, module.reward_weights, how, group_size), per_source


def rollout_stats(rollout: Rollout, kl_coef: float, comparable_sampler: bool = True) -> dict[str, Tensor]:
    """Objective stats of a shaped rollout: scores, lengths, EOS; entropy, KL and RLHF reward
    (score - `kl_coef` * KL) when it has log-probs; the trainer's log-probs against the sampler's
    when both exist and were taken at one temperature (`comparable_sampler`)."""
    mask = rollout.loss_mask  # the policy's tokens
    stats = {
        "objective/scores": rollout.scores.float().mean(),
        "response/length": mask.sum(dim=1).float().mean(),
        "response/eos_fraction": rollout.has_eos.float().mean(),
    }
    if rollout.logps is None:  # a method that never needs them (rejection sampling): no entropy, no KL
        return stats
    stats["objective/entropy"] = -masked_sum(rollout.logps, mask, dim=1).mean()  # sampled estimate, per sequence
    if rollout.ref_logps is not None:
        kl = masked_sum(rollout.logps - rollout.ref_logps, mask, dim=1)  # (N,) k1, summed per sequence
        stats["objective/kl"] = kl.mean()
        stats["objective/rlhf_reward"] = (rollout.scores.float() - kl_coef * kl).mean()
    if rollout.sampler_logps is not None and mask.any() and comparable_sampler:
        diff = (rollout.logps.float() - rollout.sampler_logps.float()).abs()[mask]  # trainer vs sampler
        stats["rollout/sampler_logprob_diff"] = diff.mean()
        stats["rollout/sampler_logprob_diff_max"] = diff.max()
    return stats


def completions_table(rollout: Rollout, tokenizer: Any, k: int) -> str:
    """The first `k` rows as a markdown table: the prompt's end, the completion, the score."""
    texts = decode_responses(tokenizer, rollout.response_ids[:k], rollout.loss_mask[:k])
    prompts = prompt_texts(rollout, tokenizer, k)

    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    rows = ["| prompt (end) | completion | score |", "|---|---|---|"]
    for p, c, s in zip(prompts, texts, rollout.scores[:k].tolist()):
        rows.append(f"| {cell(p[-200:])} | {cell(c)} | {s:.3f} |")
    return "\n".join(rows)


def log_completions(module: Any, rollout: Rollout, k: int) -> None:
    """The first `k` completions (or episodes, `train/conversations`) as a TensorBoard text table
    (`train/completions`), on rank 0 of a run with a logger that takes text."""
    experiment = getattr(module.logger, "experiment", None) if module.logger is not None else None
    if experiment is None or not hasattr(experiment, "add_text") or not module.trainer.is_global_zero:
        return
    if trajectories(rollout) is not None:
        log_conversations(rollout, module.tokenizer, experiment, k, module.global_step)
    else:
        experiment.add_text("train/completions", completions_table(rollout, module.tokenizer, k), module.global_step)
