"""The rollout side of `OnlineModule` (steps 1-4 of `lit_rlhf.modules.online`): sample, score
once, reward, shape; the rollout's objective stats and logged completions; the seeded
generators of validation sampling (`validation_rng`) and `repeat_meta`.

`RolloutMixin` holds the methods; `OnlineModule` mixes it in and defines what they read: the
sampling settings (`sampling`), the reward sources (`reward_model`, `reward_fns`), the
`generation_backend` engine slot (`_vllm_engine`) and a method's hooks (`repeats`,
`kl_coef`, `rollout_values`, `needs_rollout_logps`).
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from lit_rlhf.generation import (
    SamplingConfig,
    decode_responses,
    generate_responses,
    needs_synced_gpus,
)
from lit_rlhf.models import adapters
from lit_rlhf.ops import masked_sum
from lit_rlhf.rewards import (
    call_reward_fn,
    combine_rewards,
    function_name,
    reward_model_scores,
)
from lit_rlhf.types import PromptBatch, Rollout


class RolloutMixin:
    """Generation, reward sources and the rollout hook of an `OnlineModule` (a `PolicyModule`)."""

    @property
    def logprob_temperature(self) -> float:
        """The temperature of every log-prob a method trains on (the rollout's `logps` and
        `ref_logps`, the update's): the `logprob_temperature` setting, by default the sampling
        temperature (one temperature: docs/ARCHITECTURE.md). A method whose objective is on the
        policy's own distribution pins it in its `super().__init__` call (online DPO: 1)."""
        setting = getattr(self, "logprob_temperature_setting", None)
        return self.sampling.temperature if setting is None else setting

    @property
    def _synced_gpus(self) -> bool:
        return needs_synced_gpus(self._trainer)

    def make_rollout(self, batch: PromptBatch, repeats: int = 1, with_logps: bool = True,
                     sampling: SamplingConfig | None = None,
                     responses: tuple[Tensor, Tensor, Tensor, Tensor | None] | None = None,
                     ) -> tuple[Rollout, dict[str, Tensor]]:
        """Generate, score once (old/reference log-probs, values) and reward, without grad.

        `with_logps=False` leaves `rollout.logps` None (the update computes them). `responses`:
        responses already sampled for the repeated prompts, (response_ids, response_mask,
        has_eos, sampler_logps) as `generate` returns them (asynchronous rollouts); None =
        sample them now. `sampling` (default `self.sampling`) is how the responses are drawn; log-probs are at
        `logprob_temperature`. Returns the rollout (N = B * repeats rows, each prompt's copies contiguous) with its
        combined, unshaped scores, and each reward source's (N,) rewards by name.
        """
        prompt_ids, prompt_mask = batch.input_ids, batch.attention_mask.bool()  # (B, P)
        meta = dict(batch.meta)
        if repeats > 1:
            prompt_ids = prompt_ids.repeat_interleave(repeats, dim=0)  # (B*G, P)
            prompt_mask = prompt_mask.repeat_interleave(repeats, dim=0)
            meta = repeat_meta(meta, repeats)
        if responses is not None:  # sampled already (asynchronous rollouts, one turn per row)
            response_ids, response_mask, has_eos, sampler_logps = responses
            rollout = Rollout(prompt_ids, prompt_mask, response_ids, response_mask, has_eos, None, meta=meta,
                              sampler_logps=sampler_logps)
        elif self.environment is not None:  # multi-turn episodes (`lit_rlhf.modules.online_env`)
            rollout = self.episode_rollout(batch, meta, repeats, sampling or self.sampling)
        else:
            response_ids, response_mask, has_eos, sampler_logps = self.generate(prompt_ids, prompt_mask,
                                                                                sampling or self.sampling)
            rollout = Rollout(prompt_ids, prompt_mask, response_ids, response_mask, has_eos, None, meta=meta,
                              sampler_logps=sampler_logps)
        micro = self.micro_batch_size
        temperature = self.logprob_temperature
        # the response's attention mask: with an environment its observation tokens are context too
        args = (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_mask)
        # a prompt's `repeats` copies share one prompt computation (`shared_prompt`)
        groups = torch.arange(prompt_ids.shape[0], device=prompt_ids.device) // repeats if repeats > 1 else None
        with torch.no_grad():
            logps = self.response_token_logps(self.policy, *args, temperature, micro, groups) if with_logps else None  # (N, R)
            ref = getattr(self, "ref_model", None)
            ref_logps = None if ref is None else self.response_token_logps(ref, *args, temperature, micro, groups)
        rollout = rollout._replace(logps=policy_tokens_only(logps, rollout), ref_logps=policy_tokens_only(ref_logps, rollout))
        with torch.no_grad():
            values = self.rollout_values(rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1])
        rollout = rollout._replace(values=values)
        scores, per_source = self.score_rollout(rollout, repeats)
        self.check_finite(batch, scores=scores, values=values)
        return rollout.with_scores(scores), per_source

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        """Sample one response per prompt (`val_sampling`) and log its unshaped scores, lengths,
        EOS fraction and, with a reference, the KL."""
        # validation samples from its own generator, seeded from (seed, global step, batch):
        # training randomness never depends on whether (or how often) validation ran, so a run
        # resumed from a checkpoint saved before a validation samples what the straight run does
        with validation_rng(self.device, self.global_step, batch_idx):
            # log-probs only for the KL to the reference (none without one)
            with_logps = getattr(self, "ref_model", None) is not None
            rollout, per_source = self.make_rollout(batch, 1, with_logps=with_logps, sampling=self.val_sampling)
        stats = {
            "objective/scores": rollout.scores.float().mean(),
            "response/length": rollout.loss_mask.sum(dim=1).float().mean(),
            "response/eos_fraction": rollout.has_eos.float().mean(),
        }
        if rollout.ref_logps is not None and rollout.logps is not None:
            stats["objective/kl"] = masked_sum(rollout.logps - rollout.ref_logps, rollout.loss_mask, dim=1).mean()
        stats.update(self.episode_stats(rollout))
        self.log_stats("val", stats, batch_size=rollout.response_ids.shape[0])

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor,
                 sampling: SamplingConfig) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Sample responses with the `generation_backend` -> (response_ids (N, R), response_mask
        (N, R), has_eos (N,), the sampler's log-probs (N, R), None for `hf`). With `vllm`, the
        engine is built on first use and gets the policy's weights whenever an optimizer step
        changed them since its last sync; each row's seed comes from torch's generator."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        if self.generation_backend in ("hf", "vllm_server"):  # a server samples training batches only (online_async)
            return (*generate_responses(self.policy, prompt_ids, prompt_mask, sampling, eos, pad,
                                        synced_gpus=self._synced_gpus), None)
        return self.vllm_engine().generate(prompt_ids, prompt_mask, sampling, eos, pad)

    def vllm_engine(self):
        """The colocated vLLM engine, holding the policy's current weights (with LoRA: the base
        with the `policy` adapter merged, `lit_rlhf.generation.vllm_weights`)."""
        from lit_rlhf.generation.vllm import VLLMEngine

        step = self.global_step if self._trainer is not None else 0
        adapter = adapters.POLICY if self.lora_config is not None else None
        if self._vllm_engine is None:
            self._vllm_engine = VLLMEngine.from_policy(self.policy, self.tokenizer, adapter=adapter,
                                                       **self.vllm_kwargs)
            self._vllm_engine.synced_step = step
        elif self._vllm_engine.synced_step != step:
            self._vllm_engine.sync_weights(self.policy, step, adapter=adapter)
        return self._vllm_engine

    @torch.no_grad()
    def score_rollout(self, rollout: Rollout, group_size: int = 1) -> tuple[Tensor, dict[str, Tensor]]:
        """Every reward source on the rollout -> (weighted score (N,), {source name: (N,)}).

        `group_size` rows per prompt (contiguous); `reward_normalization: group` needs >= 2.
        Validation (the module not in training mode) reports the raw weighted sum."""
        per_source: dict[str, Tensor] = {}
        if getattr(self, "reward_model", None) is not None:
            shared = group_size > 1 and self.shared_prompt  # a prompt's copies: one prompt computation
            groups = torch.arange(rollout.prompt_ids.shape[0], device=rollout.prompt_ids.device) // group_size if shared else None
            per_source["reward_model"] = reward_model_scores(
                self.reward_model, rollout.input_ids, rollout.attention_mask, self.micro_batch_size,
                groups, rollout.prompt_ids.shape[1],
            )
        trajectories = self.trajectories(rollout)
        if self.reward_fns:
            prompts = rollout.meta.get("prompt") or self.tokenizer.batch_decode(
                [ids[m].tolist() for ids, m in zip(rollout.prompt_ids, rollout.prompt_mask)]
            )
            if trajectories is None:
                completions = decode_responses(self.tokenizer, rollout.response_ids, rollout.response_mask)
            else:  # an episode's answer is its last policy turn
                completions = [t.final_text for t in trajectories]
            columns = {
                "completion_length": rollout.loss_mask.sum(dim=1).tolist(),  # the policy's tokens, EOS included
                "truncated": (~rollout.has_eos).tolist(),
                **rollout.meta,
            }
            for fn in self.reward_fns:
                name = function_name(fn)
                while name in per_source:
                    name += "_"
                per_source[name] = call_reward_fn(fn, list(prompts), completions, columns)
        if trajectories is not None:  # the environment's return, after the other sources
            per_source["environment"] = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
        device = rollout.response_ids.device
        per_source = {k: v.to(device) for k, v in per_source.items()}
        how = self.reward_normalization if self.training else "none"  # val: raw scores
        if how == "group" and group_size < 2:
            raise ValueError("reward_normalization 'group' needs several samples per prompt (GRPO's "
                             "num_generations); this method samples one: use 'batch' or 'none'")
        return combine_rewards(per_source, self.reward_weights, how, group_size), per_source

    def collect_rollout(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """The shaped rollout a training step optimises on (`training_rollout`). Returns (rollout,
        each source's rewards, sampling stats to log). A method may sample more than one batch of
        prompts here (GRPO's dynamic sampling calls `training_rollout` once per round). With
        asynchronous rollouts the responses come from the producer's queue (`take_generated`)."""
        if self.asynchronous:
            generated, stats = self.take_generated(batch)
            responses = (generated.response_ids, generated.response_mask, generated.has_eos, generated.sampler_logps)
            rollout, per_source = self.training_rollout(batch, responses)
            return rollout, per_source, stats
        rollout, per_source = self.training_rollout(batch)
        return rollout, per_source, {}

    def training_rollout(self, batch: PromptBatch,
                         responses: tuple[Tensor, Tensor, Tensor, Tensor | None] | None = None,
                         ) -> tuple[Rollout, dict[str, Tensor]]:
        """One round of a training step's sampling: `make_rollout` (`repeats` responses per
        prompt, log-probs only when `needs_rollout_logps`; `responses` when they were sampled
        already), the method's per-row extras (`rollout_extras`, checked by `Rollout.with_extras`),
        then the rollout hooks."""
        rollout, per_source = self.make_rollout(batch, self.repeats, with_logps=self.needs_rollout_logps,
                                                responses=responses)
        extras = self.rollout_extras(batch, rollout)
        if extras:
            rollout = rollout.with_extras(**extras)
        return self.apply_rollout_hooks(rollout), per_source

    def rollout_extras(self, batch: PromptBatch, rollout: Rollout) -> dict[str, Tensor]:
        """The method's own per-row data for the update, computed at rollout time: name -> tensor
        with one row per response (N = B * `repeats`, a prompt's copies contiguous). The rollout
        has its unshaped scores here (the hooks run after). Nothing by default; ReMax adds the
        reward of each prompt's greedy response. The update reads `rollout.extras[name]`."""
        return {}

    def greedy_rollout(self, batch: PromptBatch) -> Rollout:
        """Each prompt's greedy response (B rows: `sampling` with `do_sample` off, the same
        backend), scored by the reward sources and shaped by the rollout hooks as the samples are
        (the EOS trick treats both alike); no log-probs. ReMax's baseline, from `rollout_extras`."""
        if self.environment is not None:
            raise ValueError("a greedy baseline response is one turn: not available with an environment")
        prompt_ids, prompt_mask = batch.input_ids, batch.attention_mask.bool()  # (B, P)
        ids, mask, has_eos, _ = self.generate(prompt_ids, prompt_mask, dataclasses.replace(self.sampling, do_sample=False))
        greedy = Rollout(prompt_ids, prompt_mask, ids, mask, has_eos, None, meta=dict(batch.meta))
        scores, _ = self.score_rollout(greedy)
        self.check_finite(batch, scores=scores)
        return self.apply_rollout_hooks(greedy.with_scores(scores))

    def apply_rollout_hooks(self, rollout: Rollout) -> Rollout:
        """The rollout hook: `callback.on_rollout_scores(trainer, pl_module, rollout) -> Rollout`
        for each callback of `trainer.callbacks` that defines it, in list order."""
        trainer = self._trainer
        if trainer is None:
            return rollout
        for callback in trainer.callbacks:
            hook = getattr(callback, "on_rollout_scores", None)
            if hook is None:
                continue
            shaped = hook(trainer, self, rollout)
            name = type(callback).__name__
            if not isinstance(shaped, Rollout):
                raise TypeError(f"{name}.on_rollout_scores must return a Rollout, got {type(shaped).__name__}")
            if shaped.scores is None or shaped.scores.shape != rollout.scores.shape:
                raise ValueError(f"{name}.on_rollout_scores must keep scores of shape {tuple(rollout.scores.shape)}")
            rollout = shaped
        return rollout

    def notify_rollout_end(self, rollout: Rollout) -> None:
        """`callback.on_rollout_end(trainer, pl_module, rollout)` for each callback that defines
        it, in list order, with the final rollout (after the update; `logps` None when the
        method never computed them, e.g. rejection sampling)."""
        trainer = self._trainer
        for callback in trainer.callbacks if trainer is not None else []:
            hook = getattr(callback, "on_rollout_end", None)
            if hook is not None:
                hook(trainer, self, rollout)

    def rollout_stats(self, rollout: Rollout) -> dict[str, Tensor]:
        """Objective stats of a shaped rollout: scores, lengths, EOS; entropy, KL and RLHF reward
        when it has log-probs."""
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
            stats["objective/rlhf_reward"] = (rollout.scores.float() - self.kl_coef * kl).mean()
        same_temperature = self.logprob_temperature == self.sampling.temperature  # else not comparable
        if rollout.sampler_logps is not None and rollout.logps is not None and mask.any() and same_temperature:
            diff = (rollout.logps.float() - rollout.sampler_logps.float()).abs()[mask]  # trainer vs sampler
            stats["rollout/sampler_logprob_diff"] = diff.mean()
            stats["rollout/sampler_logprob_diff_max"] = diff.max()
        return stats

    def log_completions(self, rollout: Rollout) -> None:
        """Sample completions as a TensorBoard text table (prompt tail, completion, score)."""
        logger = self.logger
        experiment = getattr(logger, "experiment", None) if logger is not None else None
        if experiment is None or not hasattr(experiment, "add_text") or not self.trainer.is_global_zero:
            return
        k = self.num_logged_completions
        if self.trajectories(rollout) is not None:
            self.log_conversations(rollout, experiment, k)
            return
        texts = decode_responses(self.tokenizer, rollout.response_ids[:k], rollout.response_mask[:k])
        prompts = rollout.meta.get("prompt") or self.tokenizer.batch_decode(
            [ids[m].tolist() for ids, m in zip(rollout.prompt_ids[:k], rollout.prompt_mask[:k])]
        )

        def cell(s: str) -> str:
            return s.replace("|", "\\|").replace("\n", " ")

        rows = ["| prompt (end) | completion | score |", "|---|---|---|"]
        for p, c, s in zip(prompts, texts, rollout.scores[:k].tolist()):
            rows.append(f"| {cell(p[-200:])} | {cell(c)} | {s:.3f} |")
        experiment.add_text("train/completions", "\n".join(rows), self.global_step)


@contextmanager
def validation_rng(device: torch.device, step: int, batch_idx: int) -> Iterator[None]:
    """Fork the torch generators (CPU, and `device` when it is a GPU) and seed them from the run's
    seed (`PL_GLOBAL_SEED`, set by `seed_everything`), `step` and `batch_idx`; the global state
    is restored on exit."""
    seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
    fork = torch.random.fork_rng(devices=[device], device_type="cuda") if device.type == "cuda" else \
        torch.random.fork_rng(devices=[])
    with fork:
        torch.manual_seed((seed * 1_000_003 + step * 10_007 + batch_idx) % (2**63))
        yield


def repeat_meta(meta: dict[str, Sequence[Any]], repeats: int) -> dict[str, list[Any]]:
    """Each column's entries repeated `repeats` times in place (a prompt's copies contiguous)."""
    return {k: [v for v in values for _ in range(repeats)] for k, values in meta.items()}


def policy_tokens_only(logps: Tensor | None, rollout: Rollout) -> Tensor | None:
    """Per-token log-probs (N, R) with 0 off the policy's tokens (`Rollout.loss_mask`): a
    multi-turn rollout scores its environment tokens as context only."""
    if logps is None or rollout.action_mask is None:
        return logps
    return torch.where(rollout.loss_mask, logps, torch.zeros((), dtype=logps.dtype, device=logps.device))
