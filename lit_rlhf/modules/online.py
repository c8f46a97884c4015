"""`OnlineModule`: the base of the methods that sample their own training data (PPO, GRPO and its
family, RLOO, ReMax, rejection sampling, online DPO, XPO, distillation).

A training step reads top to bottom here: **sample** (`make_rollout`: the `rollout` source,
`HFSampler` by default, `repeats` responses per prompt cut after the first EOS, D23), **score
once** without grad (old and reference log-probs, values, at `logprob_temperature`), **reward**
(`score`, then the method's `rollout_extras` and the callbacks' `on_rollout_scores`: `shape`),
**update** (the method's `update` over `run_updates`, the contract in `lit_rlhf.online.update`),
then the callbacks' `on_rollout_end` and the step's stats. A run is measured in episodes (sampled
responses, all ranks: `total_episodes`). A method defines `update` and, where it differs from the
default, the hooks and class attributes of the first section of `OnlineModule`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Callable, Literal

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from lit_rlhf.generation import SamplingConfig, decode_responses, needs_synced_gpus
from lit_rlhf.models import adapters
from lit_rlhf.modules.policy import PolicyModule
from lit_rlhf.online import correction, environment
from lit_rlhf.online.async_source import SourceGuard
from lit_rlhf.online.moved import MOVED
from lit_rlhf.online.sources import HFSampler, Responses, RolloutSource, SampledModel, checked_source
from lit_rlhf.online.update import (LossResult, StepLoss, loss_parts, minibatch_weight, minibatches,
                                    split_problem)
from lit_rlhf.ops import masked_sum
from lit_rlhf.rewards import RewardNormalization
from lit_rlhf.rewards.sources import (call_reward_fn, check_reward_sources, combine_rewards, function_name,
                                      prompt_texts, reward_model_scores)
from lit_rlhf.rng import validation_rng
from lit_rlhf.training.base import CHECKPOINT_KEY
from lit_rlhf.types import PromptBatch, Rollout, padding_fraction

SOURCE_KEY = "rollout_source"  # the source's state in the module's part of a checkpoint


class OnlineModule(PolicyModule):
    """Base of the online methods (see the module docstring).

    Args:
        reward_model: a `RewardModule` checkpoint or an exported `AutoModelForSequenceClassification`
            directory (frozen, read at EOS, D12), sharing the policy's tokenizer.
        reward_fns: reward functions `(prompts, completions, **batch_columns) -> rewards`
            (`lit_rlhf.rewards`); in YAML a dotted function path or `{class_path, init_args}`.
        reward_weights: one weight per reward source, the reward model first, then `reward_fns`
            in order, then an environment's return (default 1 each); the score is their sum.
        reward_normalization: each source normalised before the weighted sum: `none`, `group`
            (z-score within a prompt's responses, GDPO) or `batch` (over the rollout).
        ref_model: the frozen reference policy; None = a frozen copy of the initial policy.
        max_new_tokens: response length R: exactly this many tokens are sampled (D23).
        temperature: sampling temperature (`lit_rlhf.ops.apply_temperature`), each method's paper's
            (PPO 0.7, GRPO and RLOO 1.0); also the log-probs' unless `logprob_temperature` is set.
        top_k: top-k sampling (0 = off).
        top_p: nucleus sampling (1.0 = off).
        val_temperature: sampling temperature of the validation responses; None = `temperature`
            (the N+ paper evaluates at 0.01).
        logprob_temperature: the temperature of every log-prob the method trains on (old, new,
            reference); None = `temperature` (a DPO loss at 1.0 on responses sampled at 0.7).
        micro_batch_size: rows per forward pass, in scoring and in the update (whole groups
            where the loss reads groups); None = a whole minibatch at once.
        max_grad_norm: gradient clipping norm (0 or None = off).
        lr_schedule_per: `optimizer_step`, or `rollout` (constant over a rollout's updates, as the
            N+ reference code anneals); warmup then counts rollouts.
        total_episodes: stop after this many sampled responses (all ranks) and size the schedule
            from it; None = `trainer.max_steps` decides.
        log_completions_every_n_steps: log `num_logged_completions` sample completions as
            TensorBoard text every this many rollouts (0 = never).
        rollout: where the responses come from (`lit_rlhf.online`): `HFSampler` (default),
            `VLLMSampler` (a colocated vLLM engine), `AsyncRollouts` (a producer ahead of the
            learner) or `EnvironmentRollouts` (multi-turn episodes, where the method accepts them).
        **kwargs: `PolicyModule` (model, tokenizer, dtype, optimiser and schedule, export).
    """

    batch_types = (PromptBatch,)
    supports_tis = False
    """The update weighs the policy-gradient term by `tis_weights`: it may train on samples from
    another engine or an older policy (a source's `correction`, `AsyncRollouts`)."""
    accepts_environment = False
    """The loss is one trajectory per row, so a row may be an episode with environment tokens."""
    whole_groups = False
    """The loss reads a whole group at once (a pair loss): micro-batches hold whole groups."""
    reward_optional = False
    """The method trains without a reward source (pure on-policy distillation): scores are then 0."""
    moved_options = MOVED
    num_minibatches: int = 1
    """Minibatches of each pass over the rollout, one optimizer step each (`run_updates`)."""
    num_logged_completions: int = 4
    sampled_models: tuple[str, ...] = ("policy",)
    """The models a training rollout samples, each through `RolloutSource.for_model`, `repeats /
    len` responses per prompt each, alternating (XPO: the policy's, then the reference's)."""
    synced_gpus: bool = False  # set in `setup` (`needs_synced_gpus`)
    kl_coef: float = 0.0
    """The KL coefficient of every method (`KLControlCallback` moves it: `set_kl_coef`); what it
    weighs is the method's (a KL in the loss or in the reward)."""

    def __init__(
        self,
        reward_model: str | None = None,
        reward_fns: list[Callable] | None = None,
        reward_weights: list[float] | None = None,
        reward_normalization: RewardNormalization = "none",
        ref_model: str | None = None,
        max_new_tokens: int = 53,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        val_temperature: float | None = None,
        logprob_temperature: float | None = None,
        micro_batch_size: int | None = None,
        max_grad_norm: float | None = 1.0,
        lr_schedule_per: Literal["optimizer_step", "rollout"] = "optimizer_step",
        total_episodes: int | None = None,
        log_completions_every_n_steps: int = 50,
        rollout: RolloutSource | None = None,
        **kwargs: Any,
    ) -> None:
        source = checked_source(type(self), HFSampler() if rollout is None else rollout, temperature, logprob_temperature)
        for name, value in (("micro_batch_size", micro_batch_size), ("total_episodes", total_episodes)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if lr_schedule_per not in ("optimizer_step", "rollout"):
            raise ValueError(f"lr_schedule_per must be 'optimizer_step' or 'rollout', got {lr_schedule_per!r}")
        self.reward_fns = check_reward_sources(reward_model, reward_fns, reward_weights, reward_normalization,
                                               source.multi_turn, required=not self.reward_optional)
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.rollout_source = copy.deepcopy(source)  # the module's own: a source holds one run's state
        for name in self.sampled_models:  # a second model's source exists before a checkpoint's state is loaded
            self.rollout_source.for_model(name)
        self.sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
        self.val_sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=val_temperature or temperature,
                                           top_k=top_k, top_p=top_p)
        # the settings, read at run time (`lit_rlhf.training.settings`)
        self.reward_model_name, self.ref_model_name = reward_model, ref_model
        self.reward_weights, self.reward_normalization = reward_weights, reward_normalization
        self.micro_batch_size, self.max_grad_norm = micro_batch_size, max_grad_norm
        self.lr_schedule_per, self.total_episodes = lr_schedule_per, total_episodes
        self.log_completions_every_n_steps = log_completions_every_n_steps
        self.logprob_temperature = temperature if logprob_temperature is None else float(logprob_temperature)
        # the policy's log-probs replay the sampler's filter where they are of its temperature
        self.logprob_filter = (top_k, top_p) if self.logprob_temperature == temperature else (0, 1.0)
        if reward_model is not None:
            self.add_frozen("reward_model", self.load_reward_source(reward_model))
        self.episodes = 0  # sampled responses so far, all ranks; saved in checkpoints
        self.rollouts = 0

    # what a method defines

    @property
    def repeats(self) -> int:
        """Responses sampled per prompt (GRPO's G), contiguous: the group of the update."""
        return 1

    def init_kl(self, kl_coef: float) -> None:
        """In `__init__`: the reference model only when the KL coefficient is > 0, then the coefficient."""
        if kl_coef > 0:
            self.load_reference(self.ref_model_name, self.model_dtype)
        self.set_kl_coef(kl_coef)

    def set_kl_coef(self, value: float) -> None:
        """Set the KL coefficient (>= 0; > 0 needs the reference model a `kl_coef` 0 never loaded)."""
        value = float(value)
        if not value >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {value}")
        if value > 0 and getattr(self, "ref_model", None) is None:
            raise ValueError(f"{type(self).__name__} was built with kl_coef 0 and loaded no reference model; "
                             f"a KL coefficient of {value} needs one: give the module kl_coef > 0")
        self.kl_coef = value

    def updates_per_rollout(self) -> int:
        """Optimizer steps `update` takes per rollout (passes x minibatches); the schedule, the
        episode budget and the progress bar derive from it. Default 1 (RLOO, ReMax, online DPO)."""
        return 1

    @property
    def needs_rollout_logps(self) -> bool:
        """Whether the rollout carries the policy's sampling-time log-probs (`rollout.logps`, a
        forward pass over all rows). False when the update is on-policy and computes them itself,
        or never uses them; `rollout.logps` is then None (no entropy/KL stats from the rollout)."""
        return True

    def rollout_values(self, input_ids: Tensor, attention_mask: Tensor, response_length: int) -> Tensor | None:
        """Values (N, R) of the rollout's states (PPO); None when the method has no critic."""
        return None

    def rollout_extras(self, batch: PromptBatch, rollout: Rollout) -> dict[str, Tensor]:
        """The method's own per-row data, computed at rollout time before the hooks: name ->
        tensor with one row per response (ReMax: its greedy baseline's reward). The update reads
        `rollout.extras[name]`."""
        return {}

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        """Optimise on one shaped rollout; returns the rollout (with `logps` filled in if the update
        computed them for every row) and the stats to log (names `group/name`)."""
        raise NotImplementedError

    def step_loss(self) -> StepLoss | None:
        """A term of every optimizer step that is not a function of the rollout's rows (PPO-ptx's
        NLL on SFT rows), called once per step: `(micro, micros) -> (loss, stats)`, the loss that
        micro-batch's share, normalised over the step; None = none."""
        return None

    def update_rows(self, prompts: int) -> int:
        """The rows `update` splits into `num_minibatches` for `prompts` prompts on one rank
        (best-of-N trains on fewer than it samples): checked at start-up."""
        return prompts * self.repeats

    # the training step and the validation step

    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        started = time.perf_counter()
        rollout, per_source, stats = self.collect_rollout(batch)
        generated = time.perf_counter()
        rollout, update_stats = self.update(rollout)
        if self.lr_schedule_per == "rollout":
            self.step_lr_schedule()
        updated = time.perf_counter()
        for callback in self.trainer.callbacks:  # observe the trained rollout (KLControlCallback)
            if hasattr(callback, "on_rollout_end"):
                callback.on_rollout_end(self.trainer, self, rollout)
        self.rollouts += 1
        self.episodes += rollout.num_rows * max(1, self.trainer.world_size)

        stats.update(update_stats, **self.rollout_stats(rollout))
        stats.update({f"rewards/{name}": r.float().mean() for name, r in per_source.items()})
        stats["time/generation"] = torch.tensor(generated - started)
        stats["time/update"] = torch.tensor(updated - generated)
        stats["perf/tokens_per_sec"] = rollout.attention_mask.sum().float() / max(updated - started, 1e-9)
        stats["data/padding_fraction"] = torch.tensor(padding_fraction(rollout))  # prompt and response PAD
        stats["objective/episodes"] = torch.tensor(float(self.episodes))
        if "time/rollout_wait" in stats:  # the share of the step the learner waited for its batch
            stats["perf/trainer_idle_fraction"] = stats["time/rollout_wait"] / max(updated - started, 1e-9)
        self.log_stats("train", stats, prog_bar=("objective/scores", "objective/kl"))
        every = self.log_completions_every_n_steps
        if every and (self.rollouts - 1) % every == 0:
            self.log_completions(rollout)

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        """One response per prompt (`val_sampling`): its unshaped scores, lengths, EOS fraction
        and, with a reference, the KL. Sampled from generators seeded from (seed, step, batch), so
        training randomness never depends on whether validation ran (`lit_rlhf.rng`)."""
        with validation_rng(self.device, self.global_step, batch_idx):
            with_logps = getattr(self, "ref_model", None) is not None  # for the KL only
            rollout, _, _ = self.make_rollout(batch, 1, with_logps=with_logps, sampling=self.val_sampling)
        stats = self.rollout_stats(rollout)
        for name in ("objective/entropy", "objective/rlhf_reward", "rollout/sampler_logprob_diff",
                     "rollout/sampler_logprob_diff_max"):
            stats.pop(name, None)  # validation: the unshaped scores and the KL only
        self.log_stats("val", stats, batch_size=rollout.num_rows)

    # the rollout: sample, score once, reward, shape

    def collect_rollout(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """The shaped rollout a training step optimises on -> (rollout, each source's rewards,
        sampling stats): `make_rollout` (`repeats` responses per prompt, log-probs when
        `needs_rollout_logps`), the method's `rollout_extras`, then `shape`. A method may call it
        more than once a step (DAPO's dynamic sampling)."""
        rollout, per_source, stats = self.make_rollout(batch, self.repeats, with_logps=self.needs_rollout_logps)
        extras = self.rollout_extras(batch, rollout)
        if extras:
            rollout = rollout.with_extras(**extras)
        return self.shape(rollout), per_source, stats

    def make_rollout(self, batch: PromptBatch, repeats: int = 1, with_logps: bool = True,
                     sampling: SamplingConfig | None = None) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """Sample (the rollout source), score once (old and reference log-probs, values) and reward,
        without grad -> (rollout with its unshaped scores, each source's (N,) rewards, the source's
        sampling stats). `sampling` None: the training sampling, else validation's."""
        models = [self.sampled_model(name) for name in (self.sampled_models if sampling is None else ("policy",))]
        rollout, stats = self.rollout_source.sample_models(models, batch, repeats, sampling or self.sampling,
                                                           training=sampling is None)
        # a prompt's copies share one prompt computation (`shared_prompt`)
        groups = torch.arange(rollout.num_rows, device=rollout.prompt_ids.device) // repeats if repeats > 1 else None
        args = (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_attention_mask)
        micro, temperature, ref = self.micro_batch_size, self.logprob_temperature, getattr(self, "ref_model", None)
        with torch.no_grad():
            logps = self.response_token_logps(self.policy, *args, temperature, micro, groups) if with_logps else None
            ref_logps = None if ref is None else self.response_token_logps(ref, *args, temperature, micro, groups)
            rollout = rollout._replace(logps=rollout.on_policy_tokens(logps), ref_logps=rollout.on_policy_tokens(ref_logps))
            values = self.rollout_values(rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1])
        rollout = rollout._replace(values=values)
        scores, per_source = self.score(rollout, repeats)
        self.check_finite(batch, scores=scores, values=values)
        return rollout.with_scores(scores), per_source, stats

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, sampling: SamplingConfig) -> Responses:
        """One response per row with the rollout source's sampler, one turn."""
        return self.rollout_source.generate(self.sampled_model(), prompt_ids, prompt_mask, sampling)

    def sampled_model(self, name: str = "policy") -> SampledModel:
        """What the rollout source samples for model `name`: `policy` (its LoRA adapter, the version
        of its weights = rollouts trained on), or a frozen model held as `self.<name>`
        (`reference`: `ref_model`)."""
        trained = name == "policy"
        model = self.policy if trained else getattr(self, "ref_model" if name == "reference" else name)
        adapter = adapters.POLICY if trained and self.lora_config is not None else None
        return SampledModel(name, model, self.tokenizer, adapter, self.rollouts, self.synced_gpus, frozen=not trained)

    def greedy_rollout(self, batch: PromptBatch) -> Rollout:
        """Each prompt's greedy response (B rows, `do_sample` off, the same sampler), scored and
        shaped as the samples are; no log-probs. ReMax's baseline."""
        prompt_ids, prompt_mask = batch.input_ids, batch.attention_mask.bool()  # (B, P)
        ids, mask, has_eos, _ = self.generate(prompt_ids, prompt_mask, dataclasses.replace(self.sampling, do_sample=False))
        rollout = Rollout(prompt_ids, prompt_mask, ids, mask, has_eos, None, meta=dict(batch.meta))
        scores, _ = self.score(rollout)
        self.check_finite(batch, scores=scores)
        return self.shape(rollout.with_scores(scores))

    @torch.no_grad()
    def score(self, rollout: Rollout, group_size: int = 1) -> tuple[Tensor, dict[str, Tensor]]:
        """Every reward source on the rollout -> (weighted score (N,), {source: (N,)}): the reward
        model, the reward functions `(prompts, completions, **batch_columns)` (an episode's
        completion is its last policy turn), an environment's return; a dropped episode group
        scores 0 from every source. `group_size` rows per prompt (contiguous); the raw weighted
        sum when not training (validation)."""
        per_source: dict[str, Tensor] = {}
        if getattr(self, "reward_model", None) is not None:
            shared = group_size > 1 and self.shared_prompt  # a prompt's copies: one prompt computation
            groups = torch.arange(rollout.num_rows, device=rollout.prompt_ids.device) // group_size if shared else None
            per_source["reward_model"] = reward_model_scores(self.reward_model, rollout.input_ids, rollout.attention_mask,
                                                             self.micro_batch_size, groups, rollout.prompt_ids.shape[1])
        episodes = environment.trajectories(rollout) if self.rollout_source.multi_turn else None
        if self.reward_fns:
            prompts = prompt_texts(rollout, self.tokenizer)
            completions = (decode_responses(self.tokenizer, rollout.response_ids, rollout.loss_mask) if episodes is None
                           else [t.final_text for t in episodes])
            columns = {"completion_length": rollout.loss_mask.sum(dim=1).tolist(),  # the policy's tokens, EOS included
                       "truncated": (~rollout.has_eos).tolist(), **rollout.meta}
            taken = ("environment",) if episodes is not None else ()  # the environment's return, added below
            for fn in self.reward_fns:
                name = function_name(fn, {*per_source, *taken})
                per_source[name] = call_reward_fn(fn, list(prompts), completions, columns)
        if episodes is not None:  # the environment's return, after the other sources
            per_source["environment"] = torch.tensor([t.reward for t in episodes], dtype=torch.float32)
        device = rollout.response_ids.device
        if not per_source:  # a method that trains without a reward source (`reward_optional`)
            return torch.zeros(rollout.num_rows, device=device), per_source
        per_source = {k: v.to(device) for k, v in per_source.items()}
        dropped = environment.dropped_rows(rollout) if episodes is not None else None
        if dropped is not None:
            per_source = {k: torch.where(dropped, torch.zeros_like(v), v) for k, v in per_source.items()}
        how = self.reward_normalization if self.training else "none"
        return combine_rewards(per_source, self.reward_weights, how, group_size), per_source

    def shape(self, rollout: Rollout) -> Rollout:
        """`on_rollout_scores(trainer, module, rollout) -> Rollout` of every callback that defines
        it, in the order of `trainer.callbacks`: a callback reshapes the scores (the same shape) or
        just observes (`EOSTrickCallback`, D23)."""
        trainer = self.attached_trainer
        for callback in trainer.callbacks if trainer is not None else []:
            if not hasattr(callback, "on_rollout_scores"):
                continue
            shaped, name = callback.on_rollout_scores(trainer, self, rollout), type(callback).__name__
            if not isinstance(shaped, Rollout):
                raise TypeError(f"{name}.on_rollout_scores must return a Rollout, got {type(shaped).__name__}")
            if shaped.scores is None or shaped.scores.shape != rollout.scores.shape:
                raise ValueError(f"{name}.on_rollout_scores must keep scores of shape {tuple(rollout.scores.shape)}")
            rollout = shaped
        return rollout

    def rollout_stats(self, rollout: Rollout) -> dict[str, Tensor]:
        """What a step logs of its rollout: scores, lengths, EOS; with log-probs the entropy, and
        with the reference's the KL and the RLHF reward (score - `kl_coef` * KL); the trainer's
        log-probs against the sampler's and the source's correction when both were taken at one
        temperature; an environment's episode stats."""
        mask = rollout.loss_mask  # the policy's tokens
        stats = {"objective/scores": rollout.scores.float().mean(),
                 "response/length": mask.sum(dim=1).float().mean(),
                 "response/eos_fraction": rollout.has_eos.float().mean()}
        if self.rollout_source.multi_turn:
            stats.update(environment.episode_stats(rollout))
        if rollout.logps is None:  # a method that never needs them (rejection sampling): no entropy, no KL
            return stats
        stats["objective/entropy"] = -masked_sum(rollout.logps, mask, dim=1).mean()  # sampled estimate, per sequence
        if rollout.ref_logps is not None:
            kl = masked_sum(rollout.logps - rollout.ref_logps, mask, dim=1)  # (N,) k1, summed per sequence
            stats["objective/kl"] = kl.mean()
            stats["objective/rlhf_reward"] = (rollout.scores.float() - self.kl_coef * kl).mean()
        if rollout.sampler_logps is not None and self.logprob_temperature == self.sampling.temperature:
            stats.update(correction.correction_stats(rollout, self.rollout_source.correction))
        return stats

    def tis_weights(self, rollout: Rollout, rows: Tensor, train_logps: Tensor, advantages: Tensor | None = None):
        """The source's rollout correction of `rows` as one factor (n, R), or None when off or
        without the sampler's log-probs (`lit_rlhf.online.correction.tis_weights`)."""
        if self.rollout_source.correction is None or rollout.sampler_logps is None:
            return None
        return correction.tis_weights(self.rollout_source.correction, rollout, rows, train_logps, advantages)

    def log_completions(self, rollout: Rollout) -> None:
        """The first `num_logged_completions` completions as a TensorBoard text table
        (`train/completions`; episodes: `train/conversations`), on rank 0 with a text logger."""
        experiment, k = getattr(self.logger, "experiment", None), self.num_logged_completions
        if experiment is None or not hasattr(experiment, "add_text") or not self.trainer.is_global_zero:
            return
        if self.rollout_source.multi_turn:
            environment.log_conversations(rollout, self.tokenizer, experiment, k, self.global_step)
        else:
            experiment.add_text("train/completions", self.completions_table(rollout, k), self.global_step)

    def completions_table(self, rollout: Rollout, k: int) -> str:
        """The first `k` rows as a markdown table: the prompt's end, the completion, the score."""
        rows = ["| prompt (end) | completion | score |", "|---|---|---|"]
        texts = decode_responses(self.tokenizer, rollout.response_ids[:k], rollout.loss_mask[:k])
        for p, c, s in zip(prompt_texts(rollout, self.tokenizer, k), texts, rollout.scores[:k].tolist()):
            p, c = (x.replace("|", "\\|").replace("\n", " ") for x in (p[-200:], c))
            rows.append(f"| {p} | {c} | {s:.3f} |")
        return "\n".join(rows)

    # the update: passes over minibatches of whole groups (`lit_rlhf.online.update`)

    def run_updates(self, n_rows: int, epochs: int, num_minibatches: int, loss_fn: Callable[[Tensor], LossResult],
                    row_weights: Tensor | None = None, group_size: int | None = None) -> dict[str, Tensor]:
        """`epochs` passes over the `n_rows` rows a method trains on in `num_minibatches` minibatches
        of whole groups, one optimizer step each, gradients accumulated exactly over micro-batches
        (the contract: `lit_rlhf.online.update`). `group_size`: rows per group, None = `repeats`;
        1 for rows picked one per prompt (best-of-N). Returns the stats averaged over all
        micro-batches, plus `policy/first_ratio_mean` from the first one (exactly 1: D7)."""
        optimizer = self.optimizers()
        group = self.repeats if group_size is None else int(group_size)
        # DDP's gradient sync needs every trained parameter's gradient from each backward pass:
        # a loss's parts then run one backward pass of their sum
        separate = not isinstance(self.trainer.strategy.model, DistributedDataParallel)
        seen: list[dict[str, Tensor]] = []  # each micro-batch's stats
        for epoch in range(epochs):
            for rows in minibatches(n_rows, num_minibatches, group, shuffle=epoch > 0):
                micro = self.micro_batch_size or len(rows)  # whole groups with `whole_groups` (`check_config`)
                total, extra, micros = minibatch_weight(rows, row_weights), self.step_loss(), -(-len(rows) // micro)

                def accumulate() -> bool:
                    """Forward and backward over the minibatch's micro-batches; False when a loss is
                    not finite (`on_nonfinite: skip`; `error` raises)."""
                    for index, start in enumerate(range(0, len(rows), micro)):
                        part_rows = rows[start: start + micro]
                        share = len(part_rows) if row_weights is None else row_weights[part_rows].sum()
                        stats: dict[str, Tensor] = {}
                        result = loss_fn(part_rows)  # one (loss, stats) pair, or the parts of a loss
                        parts = [result] if isinstance(result, tuple) else loss_parts(result, separate)
                        for part, (loss, part_stats) in enumerate(parts):
                            loss = loss * (share / total)
                            if part == 0 and extra is not None:  # the step's own term, in the first part's backward
                                extra_loss, extra_stats = extra(index, micros)
                                loss, part_stats = loss + extra_loss, {**part_stats, **extra_stats}
                            if not self.check_finite(loss=loss):
                                return False
                            self.manual_backward(loss)
                            stats.update(part_stats)
                        seen.append({k: v.detach().float() for k, v in stats.items()})
                    return True

                if self.optimizer_in_backward:  # each parameter updated by its backward pass, inside the step
                    self.online_optimizer_step(optimizer, closure=accumulate)
                elif accumulate() and self.gradients_finite():
                    self.online_optimizer_step(optimizer)
                else:
                    optimizer.zero_grad(set_to_none=True)
        out = {k: sum(s.get(k, 0.0) for s in seen) / len(seen) for k in dict.fromkeys(k for s in seen for k in s)}
        first = seen[0] if seen else {}
        if "policy/ratio_mean" in first:
            out["policy/first_ratio_mean"] = first["policy/ratio_mean"]
        return out

    def online_optimizer_step(self, optimizer: Any, closure: Callable[[], bool] | None = None) -> None:
        """Clip, step, zero the grads, advance the schedule (unless it advances per rollout). With
        `closure` (`optimizer_in_backward`) the step runs it and its backward pass updates each
        parameter as its gradient completes (`lit_rlhf.training.in_backward`; no clipping there)."""
        if self.max_grad_norm and closure is None:
            self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
        optimizer.step() if closure is None else optimizer.step(closure=closure)
        optimizer.zero_grad(set_to_none=True)
        if self.lr_schedule_per == "optimizer_step":
            self.step_lr_schedule()

    def step_lr_schedule(self) -> None:
        schedulers = self.lr_schedulers()
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
            scheduler.step()

    # the fit: checks, the source's life, the budget, checkpoints

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """The shared problems, the source's, the reward's normalisation, and the update's split:
        the rows a rollout's update trains on (`update_rows`) divide into `num_minibatches`
        minibatches of whole groups, and micro-batches of whole groups for a loss that reads them
        (`whole_groups`)."""
        resamples = bool(getattr(self, "dynamic_sampling", False))
        problems = super().check_config(trainer, datamodule) + self.rollout_source.problems(trainer, type(self), resamples)
        if self.reward_normalization == "group" and self.repeats < 2:
            problems.append(f"reward_normalization 'group' z-scores a prompt's samples, and {type(self).__name__} "
                            f"samples {self.repeats} per prompt: use 'batch' or 'none'")
        if self.whole_groups and self.micro_batch_size and self.micro_batch_size % self.repeats:
            problems.append(f"{type(self).__name__}'s loss reads whole groups of {self.repeats} rows: micro_batch_size "
                            f"({self.micro_batch_size}) must be a multiple of {self.repeats}")
        batch_size = getattr(datamodule, "batch_size", None)
        if batch_size:
            problems += split_problem(type(self).__name__, batch_size, self.repeats, self.update_rows(batch_size),
                                      self.num_minibatches)
        return problems

    def setup(self, stage: str) -> None:
        super().setup(stage)
        trainer = self.attached_trainer
        if trainer is None:
            return
        self.synced_gpus = needs_synced_gpus(trainer)  # a sharded policy: every rank generates until all are done
        if isinstance(trainer.strategy, DeepSpeedStrategy) and self.max_grad_norm:  # it clips inside its step
            trainer.strategy.config.setdefault("gradient_clipping", float(self.max_grad_norm))
        if stage == "fit" and not any(isinstance(c, SourceGuard) for c in trainer.callbacks):
            trainer.callbacks.append(SourceGuard())  # stops the source if the fit fails

    def on_train_start(self) -> None:
        super().on_train_start()  # the random states first (a producer at max_staleness 0 draws from them)
        if self.budget_reached():  # resumed from the checkpoint of the run's last step: nothing left
            self.trainer.should_stop = True
        else:
            each = self.repeats // len(self.sampled_models)  # responses per prompt of each sampled model
            for name in self.sampled_models:
                self.rollout_source.for_model(name).start(self.sampled_model(name), self.trainer, self.sampling, each)

    def on_train_end(self) -> None:
        super().on_train_end()
        self.rollout_source.stop()  # after the callbacks' on_train_end (the last checkpoint)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass  # tokens/s and the padding fraction are the rollout's, logged by training_step

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.budget_reached():
            self.trainer.should_stop = True

    def budget_reached(self) -> str:
        """Why the episode budget stops the run ("" while it does not); `lit_rlhf.stopping` reads it."""
        total = self.total_episodes
        return f"total_episodes={total} reached ({self.episodes} episodes sampled)" if total and self.episodes >= total else ""

    def episodes_per_rollout(self) -> int:
        """B prompts x G responses x world size: the prompt DataModule's (or loader's) batch size."""
        trainer = self.trainer
        dm = getattr(trainer, "datamodule", None)
        size = getattr(dm, "batch_size", None) or (getattr(dm, "hparams", None) or {}).get("batch_size")
        if not size:
            trainer.fit_loop.setup_data()  # builds the train dataloader (a no-op once built)
            size = getattr(trainer.train_dataloader, "batch_size", None)
        if not size:
            raise ValueError("cannot tell the prompt batch size: give the DataModule a `batch_size`")
        return int(size) * self.repeats * max(1, trainer.world_size)

    def num_training_steps(self) -> int:
        """Optimizer steps of the fit. With `total_episodes` the run stops once that many responses
        were sampled (`budget_reached`) and lasts `ceil(total_episodes / episodes_per_rollout()) *
        updates_per_rollout()` steps (leave `trainer.max_steps` and `max_epochs` at -1: the prompt
        loader is reshuffled each epoch, D21); else `max_steps`; else the epochs' batches times
        `updates_per_rollout()`."""
        per_rollout, max_steps = self.updates_per_rollout(), self.trainer.max_steps
        if self.total_episodes:
            return math.ceil(self.total_episodes / self.episodes_per_rollout()) * per_rollout
        if max_steps and max_steps > 0:
            return int(max_steps)
        return super().num_training_steps() * per_rollout

    def num_schedule_steps(self) -> int:
        """Its optimizer steps, or its rollouts with `lr_schedule_per: rollout`."""
        steps = self.num_training_steps()
        return math.ceil(steps / self.updates_per_rollout()) if self.lr_schedule_per == "rollout" else steps

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        state = checkpoint[CHECKPOINT_KEY]
        state.update({"episodes": self.episodes, "rollouts": self.rollouts})
        source = self.rollout_source.state_dict()  # an asynchronous queue's
        if source is not None:
            state[SOURCE_KEY] = source

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get(CHECKPOINT_KEY, {})
        self.episodes, self.rollouts = int(state.get("episodes", 0)), int(state.get("rollouts", 0))
        self.rollout_source.load_state_dict(state.get(SOURCE_KEY))
