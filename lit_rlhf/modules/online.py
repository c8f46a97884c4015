"""Shared plumbing of the online methods (PPO, GRPO): rollouts, reward sources, the rollout hook.

One training step of an online method is one rollout followed by several optimizer steps:

1. **generate** (`make_rollout`): the PromptBatch's left-padded prompts (each repeated
   `repeats` times, GRPO's G) are sampled with the `SamplingConfig` built from the init args
   (temperature, top-k, top-p, `max_new_tokens` new tokens), with the KV cache, without grad,
   in eval mode; responses are cut after the first EOS and PAD-filled (D23). Under sharded
   strategies every rank keeps generating until all are done (`needs_synced_gpus`).
2. **score once**: the policy's log-probs of the sampled tokens under the sampling temperature
   (`logps`, the "old" log-probs; skipped when the update is on-policy, `needs_rollout_logps`,
   since the update's own forward pass gives the same numbers), the reference's (`ref_logps`, when a reference is used) and,
   for PPO, the values, all without grad and in micro-batches of `micro_batch_size` rows.
3. **reward** (`score_rollout`): every reward source (a reward model read at the EOS token,
   D12, and/or reward functions `(prompts, completions, **batch_columns) -> rewards`) is
   evaluated and combined with `reward_weights` into `rollout.scores`.
4. **shape** (`apply_rollout_hooks`): the rollout hook. For each callback in
   `trainer.callbacks` **in list order** (the order of the config's `trainer.callbacks`) that
   defines it, the module calls

       rollout = callback.on_rollout_scores(trainer, pl_module, rollout)  # -> Rollout

   A hook returns a new `Rollout` (it is immutable: `rollout.with_scores(new_scores)`) with
   scores of the same shape; it may also just observe. `callbacks.EOSTrickCallback` (D23) uses
   it; `callbacks.KLControlCallback` observes `on_rollout_end` instead (step 5).
5. **update** (`update`, per method): manual optimization over minibatches of the rollout with
   gradient accumulation over micro-batches, gradient clipping (`max_grad_norm`) and one
   learning-rate scheduler step per optimizer step (`run_updates`). It returns the rollout
   (with `logps` filled if it computed them) and its stats; then every callback that defines
   `on_rollout_end(trainer, pl_module, rollout) -> None` observes the final rollout (the KL
   controller measures the rollout's KL there). A non-finite score,
   value, loss or gradient never reaches the weights: it raises an error naming the step, or
   skips the optimizer step with `on_nonfinite: skip` (`PolicyModule.check_finite`).

A run is measured in **episodes**: one episode is one sampled response (B prompts x G
generations x world size per rollout). With `total_episodes` set, the module stops the trainer
once that many episodes were sampled and sizes the learning-rate schedule to
`ceil(total_episodes / episodes per rollout) * updates_per_rollout()` optimizer steps; leave
`trainer.max_steps` at -1 and `trainer.max_epochs` at -1 then (the prompt loader is simply
reshuffled each epoch, D21). Without it, `trainer.max_steps` counts optimizer steps
(`updates_per_rollout()` of them per rollout).
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Literal, Sequence

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy
from torch import Tensor

from lit_rlhf import distributed
from lit_rlhf.data.packing import padding_fraction
from lit_rlhf.generation import (
    SamplingConfig,
    decode_responses,
    generate_responses,
    needs_synced_gpus,
)
from lit_rlhf.losses import truncated_importance_weights
from lit_rlhf.models import adapters
from lit_rlhf.modules.base import CHECKPOINT_KEY, PolicyModule
from lit_rlhf.ops import masked_sum
from lit_rlhf.rewards import (
    RewardNormalization,
    call_reward_fn,
    combine_rewards,
    function_name,
    reward_model_scores,
)
from lit_rlhf.types import PromptBatch, Rollout


class OnlineModule(PolicyModule):
    """Base of PPO and GRPO: generation, reward sources, the rollout hook, the update loop.

    Args:
        reward_model: a reward model: a `RewardModule` checkpoint or an exported
            `AutoModelForSequenceClassification` directory (frozen, read at EOS, D12). It must
            share the policy's tokenizer.
        reward_fns: reward functions `(prompts, completions, **batch_columns) -> rewards` (see
            `lit_rlhf.rewards`); in YAML a dotted function path or `{class_path, init_args}`.
        reward_weights: one weight per reward source, the reward model first, then
            `reward_fns` in order (default 1 each); the score is their weighted sum.
        reward_normalization: how each source is normalised before the weighted sum: `none`,
            `group` (z-score within each prompt's G completions, GDPO's decoupled
            normalisation) or `batch` (z-score over the rollout); `rewards.normalize_reward`.
        ref_model: the frozen reference policy; None = a frozen copy of the initial policy.
        max_new_tokens: response length R: exactly this many tokens are sampled (D23).
        temperature: sampling temperature, also dividing the logits of every log-prob.
        top_k: top-k sampling (0 = off).
        top_p: nucleus sampling (1.0 = off).
        val_temperature: sampling temperature of the validation responses; None = `temperature`.
            The N+ paper evaluates its TL;DR policies at 0.01 (near greedy). Validation log-probs
            (the KL) stay at `temperature`, the distribution the KL penalty regularises.
        micro_batch_size: rows per forward pass, for scoring the rollout and for gradient
            accumulation in the update; None = a whole minibatch at once.
        max_grad_norm: gradient clipping norm (0 or None = off).
        lr_schedule_per: `optimizer_step` (the schedule advances after every optimizer step) or
            `rollout` (once per rollout, constant over its updates, as the N+ reference code
            anneals: `lr * (1 - (update - 1) / num_updates)`); warmup then counts rollouts.
        total_episodes: stop after this many sampled responses (over all ranks), and size the
            learning-rate schedule from it; None = `trainer.max_steps` decides.
        log_completions_every_n_steps: log sample completions as TensorBoard text every this
            many rollouts (0 = never).
        num_logged_completions: how many completions each such log shows.
        generation_backend: who samples the rollouts: `hf` (our KV-cache sampler, the
            reference) or `vllm` (a vLLM engine colocated in this process, holding a copy of the
            policy's weights, reloaded after every optimizer step: `lit_rlhf.generation.vllm`;
            with `lora`, the base with the policy adapter merged).
            Either way the update's log-probs are the trainer's; with `vllm` the sampler's own
            are logged against them (`rollout/sampler_logprob_diff`, mean and max of
            |log pi_train - log pi_sampler| over the response tokens).
        vllm_kwargs: keyword arguments of the vLLM engine (`VLLMEngine.from_policy`:
            `max_model_len`, `gpu_memory_utilization`, ... passed to `vllm.LLM`).
        tis_cap: truncated importance sampling (`losses.tis`): GRPO's and PPO's policy-gradient
            term of each token is weighted by min(pi_train / pi_sampler, tis_cap); None = off.
            Needs `generation_backend: vllm` (with `hf` the sampler is the trainer).
        **kwargs: `PolicyModule` (model, tokenizer, dtype, optimiser and schedule, export).
    """

    batch_types = (PromptBatch,)
    supports_tis = False  # whether the update applies `tis_cap` (GRPO, PPO)

    def __init__(
        self,
        reward_model: str | None = None,
        reward_fns: list[Callable] | None = None,
        reward_weights: list[float] | None = None,
        reward_normalization: RewardNormalization = "none",
        ref_model: str | None = None,
        max_new_tokens: int = 53,
        temperature: float = 0.7,
        top_k: int = 0,
        top_p: float = 1.0,
        val_temperature: float | None = None,
        micro_batch_size: int | None = None,
        max_grad_norm: float | None = 1.0,
        lr_schedule_per: Literal["optimizer_step", "rollout"] = "optimizer_step",
        total_episodes: int | None = None,
        log_completions_every_n_steps: int = 50,
        num_logged_completions: int = 4,
        generation_backend: Literal["hf", "vllm"] = "hf",
        vllm_kwargs: dict[str, Any] | None = None,
        tis_cap: float | None = None,
        **kwargs: Any,
    ) -> None:
        if generation_backend not in ("hf", "vllm"):
            raise ValueError(f"generation_backend must be 'hf' or 'vllm', got {generation_backend!r}")
        super().__init__(**kwargs)
        if tis_cap is not None and (generation_backend != "vllm" or tis_cap <= 0):
            raise ValueError(f"tis_cap (got {tis_cap}) must be > 0 and needs generation_backend 'vllm' "
                             f"(got {generation_backend!r}): with 'hf' the sampler is the trainer")
        if tis_cap is not None and not self.supports_tis:
            raise ValueError(f"{type(self).__name__} has no truncated importance sampling: tis_cap is for GRPO and PPO")
        self._vllm_engine = None  # built on the first rollout (generation_backend: vllm)
        self.automatic_optimization = False
        self.sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
        self.val_sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=val_temperature or temperature,
                                           top_k=top_k, top_p=top_p)
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {micro_batch_size}")
        if lr_schedule_per not in ("optimizer_step", "rollout"):
            raise ValueError(f"lr_schedule_per must be 'optimizer_step' or 'rollout', got {lr_schedule_per!r}")
        if total_episodes is not None and total_episodes < 1:
            raise ValueError(f"total_episodes must be >= 1 or None, got {total_episodes}")
        self.reward_fns = list(reward_fns or [])
        for fn in self.reward_fns:
            if not callable(fn):
                raise TypeError(f"reward_fns entries must be callables, got {fn!r}")
        if reward_model is None and not self.reward_fns:
            raise ValueError("no reward source: set reward_model and/or reward_fns")
        n_sources = int(reward_model is not None) + len(self.reward_fns)
        if reward_weights is not None and len(reward_weights) != n_sources:
            raise ValueError(
                f"reward_weights has {len(reward_weights)} entries for {n_sources} reward sources "
                "(the reward model first, then reward_fns in order)"
            )
        if reward_normalization not in ("none", "group", "batch"):
            raise ValueError(f"reward_normalization must be 'none', 'group' or 'batch', got {reward_normalization!r}")
        if reward_model is not None:
            self.add_frozen("reward_model", self.load_reward_source(reward_model))
        self.episodes = 0  # sampled responses so far, all ranks; saved in checkpoints
        self.rollouts = 0

    # ------------------------------------------------------------------------------------------
    # what a method defines
    # ------------------------------------------------------------------------------------------

    @property
    def repeats(self) -> int:
        """Responses sampled per prompt (GRPO's G)."""
        return 1

    @property
    def kl_weight(self) -> float:
        """The coefficient of the KL to the reference (PPO's `kl_coef`, GRPO's `beta`)."""
        return 0.0

    def updates_per_rollout(self) -> int:
        """Optimizer steps taken on each rollout."""
        raise NotImplementedError

    def rollout_values(self, input_ids: Tensor, attention_mask: Tensor, response_length: int) -> Tensor | None:
        """Values (N, R) of the rollout's states (PPO); None when the method has no critic."""
        return None

    @property
    def needs_rollout_logps(self) -> bool:
        """Whether the rollout must carry the sampling-time log-probs before the update (False
        when the update is on-policy and computes them in its own forward pass)."""
        return True

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        """Optimise on one shaped rollout; returns the rollout (with `logps` filled when it was
        None) and the stats to log (names `group/name`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------
    # rollouts
    # ------------------------------------------------------------------------------------------

    @property
    def _synced_gpus(self) -> bool:
        return needs_synced_gpus(self._trainer)

    def make_rollout(self, batch: PromptBatch, repeats: int = 1, with_logps: bool = True,
                     sampling: SamplingConfig | None = None) -> tuple[Rollout, dict[str, Tensor]]:
        """Generate, score once (old/reference log-probs, values) and reward, without grad.

        `with_logps=False` leaves `rollout.logps` None (the update computes them). `sampling`
        (default `self.sampling`) is how the responses are drawn; log-probs are always at the
        training temperature. Returns the rollout (N = B * repeats rows, each prompt's copies contiguous) with its
        combined, unshaped scores, and each reward source's (N,) rewards by name.
        """
        prompt_ids, prompt_mask = batch.input_ids, batch.attention_mask.bool()  # (B, P)
        meta = dict(batch.meta)
        if repeats > 1:
            prompt_ids = prompt_ids.repeat_interleave(repeats, dim=0)  # (B*G, P)
            prompt_mask = prompt_mask.repeat_interleave(repeats, dim=0)
            meta = repeat_meta(meta, repeats)
        response_ids, response_mask, has_eos, sampler_logps = self.generate(prompt_ids, prompt_mask, sampling or self.sampling)
        micro = self.hparams.micro_batch_size
        temperature = self.sampling.temperature
        args = (prompt_ids, prompt_mask, response_ids, response_mask)
        # a prompt's `repeats` copies share one prompt computation (`shared_prompt`)
        groups = torch.arange(prompt_ids.shape[0], device=prompt_ids.device) // repeats if repeats > 1 else None
        with torch.no_grad():
            logps = self.response_token_logps(self.policy, *args, temperature, micro, groups) if with_logps else None  # (N, R)
            ref = getattr(self, "ref_model", None)
            ref_logps = None if ref is None else self.response_token_logps(ref, *args, temperature, micro, groups)
        rollout = Rollout(prompt_ids, prompt_mask, response_ids, response_mask, has_eos, logps, ref_logps, meta=meta,
                          sampler_logps=sampler_logps)
        with torch.no_grad():
            values = self.rollout_values(rollout.input_ids, rollout.attention_mask, response_ids.shape[1])
        rollout = rollout._replace(values=values)
        scores, per_source = self.score_rollout(rollout, repeats)
        self.check_finite(batch, scores=scores, values=values)
        return rollout.with_scores(scores), per_source

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor,
                 sampling: SamplingConfig) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Sample responses with the `generation_backend` -> (response_ids (N, R), response_mask
        (N, R), has_eos (N,), the sampler's log-probs (N, R), None for `hf`). With `vllm`, the
        engine is built on first use and gets the policy's weights whenever an optimizer step
        changed them since its last sync; each row's seed comes from torch's generator."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        if self.hparams.get("generation_backend", "hf") == "hf":
            return (*generate_responses(self.policy, prompt_ids, prompt_mask, sampling, eos, pad,
                                        synced_gpus=self._synced_gpus), None)
        return self.vllm_engine().generate(prompt_ids, prompt_mask, sampling, eos, pad)

    def vllm_engine(self):
        """The colocated vLLM engine, holding the policy's current weights (with LoRA: the base
        with the `policy` adapter merged, `lit_rlhf.generation.vllm`)."""
        from lit_rlhf.generation.vllm import VLLMEngine

        step = self.global_step if self._trainer is not None else 0
        adapter = adapters.POLICY if self.lora_config is not None else None
        if self._vllm_engine is None:
            self._vllm_engine = VLLMEngine.from_policy(self.policy, self.tokenizer, adapter=adapter,
                                                       **(self.hparams.get("vllm_kwargs") or {}))
            self._vllm_engine.synced_step = step
        elif self._vllm_engine.synced_step != step:
            self._vllm_engine.sync_weights(self.policy, step, adapter=adapter)
        return self._vllm_engine

    def tis_weights(self, rollout: Rollout, rows: Tensor, train_logps: Tensor) -> Tensor | None:
        """Truncated importance weights (n, R) of `rows` (`tis_cap`), None when TIS is off.
        `train_logps`: the trainer's log-probs of those rows at sampling time."""
        cap = self.hparams.get("tis_cap")
        if cap is None or rollout.sampler_logps is None:
            return None
        return truncated_importance_weights(train_logps, rollout.sampler_logps[rows], rollout.response_mask[rows], cap)

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
                self.reward_model, rollout.input_ids, rollout.attention_mask, self.hparams.micro_batch_size,
                groups, rollout.prompt_ids.shape[1],
            )
        if self.reward_fns:
            prompts = rollout.meta.get("prompt") or self.tokenizer.batch_decode(
                [ids[m].tolist() for ids, m in zip(rollout.prompt_ids, rollout.prompt_mask)]
            )
            completions = decode_responses(self.tokenizer, rollout.response_ids, rollout.response_mask)
            columns = {
                "completion_length": rollout.response_mask.sum(dim=1).tolist(),  # tokens, EOS included
                "truncated": (~rollout.has_eos).tolist(),
                **rollout.meta,
            }
            for fn in self.reward_fns:
                name = function_name(fn)
                while name in per_source:
                    name += "_"
                per_source[name] = call_reward_fn(fn, list(prompts), completions, columns)
        device = rollout.response_ids.device
        per_source = {k: v.to(device) for k, v in per_source.items()}
        how = self.hparams.get("reward_normalization", "none") if self.training else "none"  # val: raw scores
        if how == "group" and group_size < 2:
            raise ValueError("reward_normalization 'group' needs several samples per prompt (GRPO's "
                             "num_generations); this method samples one: use 'batch' or 'none'")
        return combine_rewards(per_source, self.hparams.reward_weights, how, group_size), per_source

    def collect_rollout(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """The shaped rollout a training step optimises on: `make_rollout` then the rollout hooks.
        Returns (rollout, each source's rewards, sampling stats to log). A method may sample more
        than one batch of prompts here (GRPO's dynamic sampling)."""
        rollout, per_source = self.make_rollout(batch, self.repeats, with_logps=self.needs_rollout_logps)
        return self.apply_rollout_hooks(rollout), per_source, {}

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
        it, in list order, with the final rollout (after the update; `logps` always filled)."""
        trainer = self._trainer
        for callback in trainer.callbacks if trainer is not None else []:
            hook = getattr(callback, "on_rollout_end", None)
            if hook is not None:
                hook(trainer, self, rollout)

    # ------------------------------------------------------------------------------------------
    # the update loop
    # ------------------------------------------------------------------------------------------

    def minibatches(self, n_rows: int, num_minibatches: int, shuffle: bool = True) -> Iterator[Tensor]:
        """Row indices of `num_minibatches` minibatches covering the rollout once."""
        if n_rows % num_minibatches:
            raise ValueError(f"the rollout's {n_rows} rows do not split into num_minibatches={num_minibatches} equal minibatches")
        order = torch.randperm(n_rows) if shuffle else torch.arange(n_rows)
        return iter(order.view(num_minibatches, -1))

    def run_updates(
        self,
        n_rows: int,
        epochs: int,
        num_minibatches: int,
        loss_fn: Callable[[Tensor], tuple[Tensor, dict[str, Tensor]]],
        row_weights: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """`epochs` passes over the rollout in `num_minibatches` minibatches, one optimizer step
        each, accumulating gradients over micro-batches of `micro_batch_size` rows.

        `loss_fn(rows)` gets the rollout row indices of a micro-batch and returns (loss, stats),
        the loss averaged over that micro-batch. Each micro-batch's loss is weighted by its share
        of the minibatch's total weight, so the accumulated gradient is that of the loss over the
        whole minibatch, whatever `micro_batch_size`:

        - `row_weights` None: every row weighs 1 (a mean over sequences: the share of rows);
        - `row_weights` (N,): the weight of each row, e.g. its number of response tokens for a
          token-mean loss: a micro-batch's token mean times its tokens over the minibatch's tokens
          is its token sum over the minibatch's tokens. The minibatch total is summed over all
          ranks and multiplied by the world size (data parallelism averages the ranks'
          gradients), so the loss is the token mean of the GLOBAL minibatch.

        Returns the stats averaged over all micro-batches, plus `policy/first_ratio_mean` from the
        first one (exactly 1: D7).
        """
        optimizer = self.optimizers()
        totals: dict[str, Tensor] = {}
        count = 0
        first: dict[str, Tensor] = {}
        for epoch in range(epochs):
            # the first pass keeps the rollout's row order, so its first micro-batch is the one
            # the old log-probs were computed on (bitwise equal ratios, D7)
            for rows in self.minibatches(n_rows, num_minibatches, shuffle=epoch > 0):
                micro = self.hparams.micro_batch_size or len(rows)
                total = self.minibatch_weight(rows, row_weights)
                finite = True
                for start in range(0, len(rows), micro):
                    micro_rows = rows[start: start + micro]
                    loss, stats = loss_fn(micro_rows)
                    finite = self.check_finite(loss=loss)  # raises (on_nonfinite: error) or skips the step
                    if not finite:
                        break
                    share = len(micro_rows) if row_weights is None else row_weights[micro_rows].sum()
                    self.manual_backward(loss * (share / total))
                    if not first:
                        first = {k: v.detach() for k, v in stats.items()}
                    for k, v in stats.items():
                        totals[k] = totals.get(k, 0.0) + v.detach().float()
                    count += 1
                if finite and self.gradients_finite():
                    self.apply_optimizer_step(optimizer)
                else:
                    optimizer.zero_grad(set_to_none=True)
        out = {k: v / max(count, 1) for k, v in totals.items()}
        if "policy/ratio_mean" in first:
            out["policy/first_ratio_mean"] = first["policy/ratio_mean"]
        return out

    @staticmethod
    def minibatch_weight(rows: Tensor, row_weights: Tensor | None) -> Tensor | float:
        """The total weight a minibatch's micro-batch losses are divided by (see `run_updates`)."""
        if row_weights is None:
            return float(len(rows))
        total = row_weights[rows].sum().float()
        if distributed.is_distributed():  # the global minibatch: every rank's rows, then DDP's 1/W
            total = distributed.all_reduce_sum(total) / distributed.world_size()
        return total.clamp(min=1e-6)  # a minibatch with no token in the loss (all masked): zero, not 0/0

    def setup(self, stage: str) -> None:
        super().setup(stage)
        # Under DeepSpeed the engine clips inside its step and Lightning's `clip_gradients` does
        # nothing: hand it `max_grad_norm` (read when the engine is built, after this hook).
        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, DeepSpeedStrategy) and self.hparams.max_grad_norm:
            strategy.config.setdefault("gradient_clipping", float(self.hparams.max_grad_norm))

    def apply_optimizer_step(self, optimizer) -> None:
        """Clip, step, zero the grads, advance the learning-rate schedule by one step (unless
        it advances per rollout: `step_lr_schedule` after the update then)."""
        max_norm = self.hparams.max_grad_norm
        if max_norm:
            self.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self.hparams.get("lr_schedule_per", "optimizer_step") == "optimizer_step":
            self.step_lr_schedule()

    def step_lr_schedule(self) -> None:
        schedulers = self.lr_schedulers()
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
            scheduler.step()

    # ------------------------------------------------------------------------------------------
    # the training step
    # ------------------------------------------------------------------------------------------

    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        started = time.perf_counter()
        rollout, per_source, sampling_stats = self.collect_rollout(batch)
        generated = time.perf_counter()
        rollout, stats = self.update(rollout)
        if self.hparams.get("lr_schedule_per", "optimizer_step") == "rollout":
            self.step_lr_schedule()
        updated = time.perf_counter()
        self.notify_rollout_end(rollout)

        n = rollout.response_ids.shape[0]
        self.rollouts += 1
        self.episodes += n * max(1, self._trainer.world_size if self._trainer else 1)
        stats.update(self.rollout_stats(rollout))
        stats.update(sampling_stats)
        stats.update({f"rewards/{name}": r.float().mean() for name, r in per_source.items()})
        stats["time/generation"] = torch.tensor(generated - started)
        stats["time/update"] = torch.tensor(updated - generated)
        stats["perf/tokens_per_sec"] = rollout.attention_mask.sum().float() / max(updated - started, 1e-9)
        stats["data/padding_fraction"] = torch.tensor(padding_fraction(rollout))  # prompt and response PAD
        stats["objective/episodes"] = torch.tensor(float(self.episodes))
        self.log_stats("train", stats, prog_bar=("objective/scores", "objective/kl"))
        every = self.hparams.log_completions_every_n_steps
        if every and (self.rollouts - 1) % every == 0:
            self.log_completions(rollout)

    def rollout_stats(self, rollout: Rollout) -> dict[str, Tensor]:
        """Objective stats of a shaped rollout: scores, KL, entropy, RLHF reward, lengths, EOS."""
        mask = rollout.response_mask
        stats = {
            "objective/scores": rollout.scores.float().mean(),
            "objective/entropy": -masked_sum(rollout.logps, mask, dim=1).mean(),  # sampled estimate, per sequence
            "response/length": mask.sum(dim=1).float().mean(),
            "response/eos_fraction": rollout.has_eos.float().mean(),
        }
        if rollout.ref_logps is not None:
            kl = masked_sum(rollout.logps - rollout.ref_logps, mask, dim=1)  # (N,) k1, summed per sequence
            stats["objective/kl"] = kl.mean()
            stats["objective/rlhf_reward"] = (rollout.scores.float() - self.kl_weight * kl).mean()
        if rollout.sampler_logps is not None and rollout.logps is not None and mask.any():
            diff = (rollout.logps.float() - rollout.sampler_logps.float()).abs()[mask]  # trainer vs sampler, same temperature
            stats["rollout/sampler_logprob_diff"] = diff.mean()
            stats["rollout/sampler_logprob_diff_max"] = diff.max()
        return stats

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass  # tokens/s and the padding fraction are logged by training_step (prompt + response tokens)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)  # bookkeeping (tokens/s is logged in training_step)
        if self.budget_reached():
            self.trainer.should_stop = True

    def budget_reached(self) -> str:
        """Why the episode budget stops the run ("" while it does not)."""
        total = self.hparams.total_episodes
        if total and self.episodes >= total:
            return f"total_episodes={total} reached ({self.episodes} episodes sampled)"
        return ""

    def log_completions(self, rollout: Rollout) -> None:
        """Sample completions as a TensorBoard text table (prompt tail, completion, score)."""
        logger = self.logger
        experiment = getattr(logger, "experiment", None) if logger is not None else None
        if experiment is None or not hasattr(experiment, "add_text") or not self.trainer.is_global_zero:
            return
        k = self.hparams.num_logged_completions
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

    # ------------------------------------------------------------------------------------------
    # validation: sample once per prompt and report the unshaped scores
    # ------------------------------------------------------------------------------------------

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        # validation samples from its own generator, seeded from (seed, global step, batch):
        # training randomness never depends on whether (or how often) validation ran, so a run
        # resumed from a checkpoint saved before a validation samples what the straight run does
        with validation_rng(self.device, self.global_step, batch_idx):
            rollout, per_source = self.make_rollout(batch, 1, sampling=self.val_sampling)
        stats = {
            "objective/scores": rollout.scores.float().mean(),
            "response/length": rollout.response_mask.sum(dim=1).float().mean(),
            "response/eos_fraction": rollout.has_eos.float().mean(),
        }
        if rollout.ref_logps is not None:
            stats["objective/kl"] = masked_sum(rollout.logps - rollout.ref_logps, rollout.response_mask, dim=1).mean()
        self.log_stats("val", stats, batch_size=rollout.response_ids.shape[0])

    # ------------------------------------------------------------------------------------------
    # schedule length and checkpointed counters
    # ------------------------------------------------------------------------------------------

    def prompts_per_rollout(self) -> int:
        """Prompts per rollout on one rank: the prompt DataModule's (or loader's) batch size."""
        trainer = self.trainer
        dm = getattr(trainer, "datamodule", None)
        size = getattr(dm, "batch_size", None) or (getattr(dm, "hparams", None) or {}).get("batch_size")
        if not size:
            trainer.fit_loop.setup_data()  # builds the train dataloader (a no-op once built)
            size = getattr(trainer.train_dataloader, "batch_size", None)
        if not size:
            raise ValueError("cannot tell the prompt batch size: give the DataModule a `batch_size`")
        return int(size)

    def num_schedule_steps(self) -> int:
        """Scheduler steps of the fit: optimizer steps, or rollouts with `lr_schedule_per: rollout`."""
        steps = self.num_training_steps()
        if self.hparams.get("lr_schedule_per", "optimizer_step") == "rollout":
            return math.ceil(steps / self.updates_per_rollout())
        return steps

    def episodes_per_rollout(self) -> int:
        return self.prompts_per_rollout() * self.repeats * max(1, self.trainer.world_size)

    def num_training_steps(self) -> int:
        """Optimizer steps of the fit: from `total_episodes`, else `max_steps`, else epochs."""
        per_rollout = self.updates_per_rollout()
        total = self.hparams.total_episodes
        if total:
            return math.ceil(total / self.episodes_per_rollout()) * per_rollout
        if self.trainer.max_steps and self.trainer.max_steps > 0:
            return int(self.trainer.max_steps)
        return super().num_training_steps() * per_rollout

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[CHECKPOINT_KEY].update({"episodes": self.episodes, "rollouts": self.rollouts})

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        info = checkpoint.get(CHECKPOINT_KEY, {})
        self.episodes = int(info.get("episodes", 0))
        self.rollouts = int(info.get("rollouts", 0))


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
