"""`OnlineModule`: the base of the methods that sample their own training data (PPO, GRPO and its
family, RLOO, ReMax, rejection sampling, online DPO).

One training step is one rollout, then the method's update: **sample** `repeats` responses per
prompt from the rollout source (`rollout`: `HFSampler` by default), **score once** without grad
(log-probs at `logprob_temperature`, values) and **reward** (the reward sources, the method's
`rollout_extras`, the callbacks' rollout hook), as `lit_rlhf.online.rollout` details; then
**update** (the method's `update`): passes over minibatches of whole groups, one optimizer step
each (`run_updates`, `lit_rlhf.online.update`), and `on_rollout_end` for the callbacks. The fit's
plumbing (set-up, the source's start, checkpoint state) is `lit_rlhf.online.lifecycle`'s.

A non-finite score, value, loss or gradient never reaches the weights (`check_finite`). A run is
measured in episodes (sampled responses), which also size the learning-rate schedule
(`total_episodes`, `lit_rlhf.online.budget`).

**What a method defines** (each documented below): `update`; and where it differs from the
default, `repeats`, `updates_per_rollout`, `needs_rollout_logps`, `rollout_values`,
`rollout_extras`, `step_loss`, `update_rows`, `check_config`, the attributes `supports_tis` (its
loss applies the source's rollout correction `tis_weights`), `accepts_environment` (its maths is one
trajectory per row: it may run episodes), `whole_groups` (its loss reads a group at once) and
`reward_optional` (it trains without a reward source), and `kl_coef` through `init_kl`.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Literal

from torch import Tensor

from lit_rlhf.generation import SamplingConfig
from lit_rlhf.lightning_compat import attached_trainer
from lit_rlhf.training.base import CHECKPOINT_KEY
from lit_rlhf.modules.policy import PolicyModule
from lit_rlhf.online import budget, correction, hooks, lifecycle, rollout as rollouts, scoring, update
from lit_rlhf.online.moved import MOVED
from lit_rlhf.online.sources import HFSampler, Responses, RolloutSource, checked_source
from lit_rlhf.rewards import RewardNormalization
from lit_rlhf.rng import validation_rng
from lit_rlhf.types import PromptBatch, Rollout


class OnlineModule(PolicyModule):
    """Base of the online methods (see the module docstring).

    Args:
        reward_model: a reward model: a `RewardModule` checkpoint or an exported
            `AutoModelForSequenceClassification` directory (frozen, read at EOS, D12), sharing the
            policy's tokenizer.
        reward_fns: reward functions `(prompts, completions, **batch_columns) -> rewards` (see
            `lit_rlhf.rewards`); in YAML a dotted function path or `{class_path, init_args}`.
        reward_weights: one weight per reward source, the reward model first, then `reward_fns`
            in order, then an environment's return (default 1 each); the score is their sum.
        reward_normalization: each source normalised before the weighted sum: `none`, `group`
            (z-score within a prompt's responses, GDPO) or `batch` (over the rollout).
        ref_model: the frozen reference policy; None = a frozen copy of the initial policy.
        max_new_tokens: response length R: exactly this many tokens are sampled (D23).
        temperature: sampling temperature (`lit_rlhf.ops.apply_temperature`); each method
            declares its paper's (PPO 0.7, GRPO and RLOO 1.0). Also the log-prob temperature
            unless `logprob_temperature` is set.
        top_k: top-k sampling (0 = off).
        top_p: nucleus sampling (1.0 = off).
        val_temperature: sampling temperature of the validation responses; None = `temperature`
            (the N+ paper evaluates at 0.01). Validation log-probs stay at `logprob_temperature`.
        logprob_temperature: the temperature of every log-prob the method trains on (old, new,
            reference); None = `temperature`. Set apart to train another distribution (a DPO
            loss at 1.0 on responses sampled at 0.7).
        micro_batch_size: rows per forward pass, in scoring and in the update (whole groups
            where the loss reads groups); None = a whole minibatch at once.
        max_grad_norm: gradient clipping norm (0 or None = off).
        lr_schedule_per: `optimizer_step`, or `rollout` (constant over a rollout's updates, as the
            N+ reference code anneals); warmup then counts rollouts.
        total_episodes: stop after this many sampled responses (all ranks) and size the schedule
            from it; None = `trainer.max_steps` decides.
        log_completions_every_n_steps: log `num_logged_completions` sample completions as
            TensorBoard text every this many rollouts (0 = never).
        rollout: where the responses come from (`lit_rlhf.online`): `HFSampler` (default, our
            sampler in this process), `VLLMSampler` (a colocated vLLM engine), `AsyncRollouts`
            (a producer ahead of the learner, on a thread or a vLLM server) or
            `EnvironmentRollouts` (multi-turn episodes; for methods that accept them).
        **kwargs: `PolicyModule` (model, tokenizer, dtype, optimiser and schedule, export).
    """

    batch_types = (PromptBatch,)
    supports_tis = False
    """The update weighs the policy-gradient term by `tis_weights` (the GRPO family, RLOO, PPO,
    distillation): it may train on samples from another engine or an older policy
    (`VLLMSampler(correction=...)` or `tis_cap`, `AsyncRollouts`)."""
    accepts_environment = False
    """The method's maths is one trajectory per row, so a row may be an episode with environment
    tokens (GRPO, PPO, RLOO, rejection sampling); any other refuses `EnvironmentRollouts`."""
    whole_groups = False
    """The loss reads a whole group at once (a pair loss): micro-batches hold whole groups."""
    reward_optional = False
    """The method trains without a reward source (pure on-policy distillation): scores are then 0."""
    moved_options = MOVED
    """Online settings that moved to the rollout source (`lit_rlhf.online.moved`)."""
    num_minibatches: int = 1
    """Minibatches of each pass over the rollout, one optimizer step each (`run_updates`)."""
    num_logged_completions: int = 4
    """Completions (or episodes) each completion log shows."""
    kl_coef: float = 0.0
    """The KL coefficient, one name for every method; `KLControlCallback` moves it (`set_kl_coef`).
    What it weighs is the method's (its docstring says: a KL in the loss or in the reward)."""

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
        self.reward_fns = scoring.checked_reward_sources(reward_model, reward_fns, reward_weights, reward_normalization,
                                                         source.multi_turn, required=not self.reward_optional)
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.rollout_source = copy.deepcopy(source)  # the module's own: a source holds one run's state
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
        if reward_model is not None:
            self.add_frozen("reward_model", self.load_reward_source(reward_model))
        self.episodes = 0  # sampled responses so far, all ranks; saved in checkpoints
        self.rollouts = 0

    # ------------------------------------------------------------------------------------------
    # what a method defines
    # ------------------------------------------------------------------------------------------

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

    def step_loss(self) -> update.StepLoss | None:
        """A term of every optimizer step that is not a function of the rollout's rows (PPO-ptx's
        NLL on SFT rows), called once per step: `(micro, micros) -> (loss, stats)`, the loss that
        micro-batch's share, normalised over the step; None = none (`lit_rlhf.online.update`)."""
        return None

    def update_rows(self, prompts: int) -> int:
        """The rows `update` splits into `num_minibatches` for `prompts` prompts on one rank
        (best-of-N trains on fewer than it samples): checked at start-up."""
        return prompts * self.repeats

    # ------------------------------------------------------------------------------------------
    # the training step and the validation step
    # ------------------------------------------------------------------------------------------

    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        started = time.perf_counter()
        rollout, per_source, sampling_stats = self.collect_rollout(batch)
        generated = time.perf_counter()
        rollout, stats = self.update(rollout)
        if self.lr_schedule_per == "rollout":
            update.step_lr_schedule(self)
        updated = time.perf_counter()
        trainer = attached_trainer(self)
        hooks.notify_rollout_end(trainer, self, rollout)

        self.rollouts += 1
        self.episodes += rollout.num_rows * max(1, trainer.world_size if trainer else 1)
        stats = rollouts.step_stats(self, stats, rollout, per_source, sampling_stats, started, generated, updated)
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
        self.log_stats("val", rollouts.validation_stats(rollout), batch_size=rollout.num_rows)

    # ------------------------------------------------------------------------------------------
    # the rollout
    # ------------------------------------------------------------------------------------------

    def collect_rollout(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """The shaped rollout a training step optimises on -> (rollout, each source's rewards,
        sampling stats). A method may sample more than once here (DAPO's dynamic sampling)."""
        return self.training_rollout(batch)

    def training_rollout(self, batch: PromptBatch) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """One round of a training step's sampling (`lit_rlhf.online.rollout.training_rollout`)."""
        return rollouts.training_rollout(self, batch)

    def make_rollout(self, batch: PromptBatch, repeats: int = 1, with_logps: bool = True,
                     sampling: SamplingConfig | None = None) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
        """Sample, score once and reward, without grad -> (rollout, each source's rewards, sampling
        stats); `sampling` None: the training sampling (`lit_rlhf.online.rollout.make_rollout`)."""
        return rollouts.make_rollout(self, batch, repeats, with_logps, sampling)

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, sampling: SamplingConfig) -> Responses:
        """One response per row with the rollout source's sampler, one turn."""
        return self.rollout_source.generate(self, prompt_ids, prompt_mask, sampling)

    def greedy_rollout(self, batch: PromptBatch) -> Rollout:
        """Each prompt's greedy response, scored and shaped; ReMax's baseline (`lit_rlhf.online.rollout`)."""
        return rollouts.greedy_rollout(self, batch)

    # ------------------------------------------------------------------------------------------
    # the update
    # ------------------------------------------------------------------------------------------

    def run_updates(self, n_rows: int, epochs: int, num_minibatches: int, loss_fn: Callable[[Tensor], Any],
                    row_weights: Tensor | None = None, group_size: int | None = None) -> dict[str, Tensor]:
        """`epochs` passes over minibatches of whole groups, one optimizer step each, gradients
        accumulated exactly over micro-batches (`lit_rlhf.online.update.run_updates`)."""
        return update.run_updates(self, n_rows, epochs, num_minibatches, loss_fn, row_weights, group_size)

    def tis_weights(self, rollout: Rollout, rows: Tensor, train_logps: Tensor, advantages: Tensor | None = None):
        """The source's rollout correction of `rows` as one factor (n, R), or None when off or
        without the sampler's log-probs (`lit_rlhf.online.correction.tis_weights`)."""
        return correction.tis_weights(self.rollout_source.correction, rollout, rows, train_logps, advantages)

    # ------------------------------------------------------------------------------------------
    # Lightning hooks: checks, the source's life, the budget, checkpoints
    # ------------------------------------------------------------------------------------------

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """The shared problems, the source's, and the update's split (`update.split_problems`)."""
        problems = super().check_config(trainer, datamodule) + self.rollout_source.problems(self, trainer)
        return problems + update.split_problems(self, getattr(datamodule, "batch_size", None))

    def setup(self, stage: str) -> None:
        super().setup(stage)
        lifecycle.setup(self, stage)  # DeepSpeed's clipping, the source's guard

    def on_train_start(self) -> None:
        super().on_train_start()  # the random states first (a producer at max_staleness 0 draws from them)
        lifecycle.start(self)

    def on_train_end(self) -> None:
        super().on_train_end()
        self.rollout_source.stop()  # after the callbacks' on_train_end (the last checkpoint)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass  # tokens/s and the padding fraction are the rollout's, logged by training_step

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.budget_reached():
            self.trainer.should_stop = True

    def num_training_steps(self) -> int:
        """Optimizer steps of the fit (`lit_rlhf.online.budget`): from `total_episodes`, else
        `max_steps`, else the epochs' batches times `updates_per_rollout()`."""
        by_budget = self.total_episodes or (self.trainer.max_steps and self.trainer.max_steps > 0)
        return budget.training_steps(self, 0 if by_budget else super().num_training_steps())

    def num_schedule_steps(self) -> int:
        return budget.schedule_steps(self, self.num_training_steps())

    def episodes_per_rollout(self) -> int:
        return budget.episodes_per_rollout(self)

    def budget_reached(self) -> str:
        """Why the episode budget stops the run ("" while it does not); `lit_rlhf.stopping` reads it."""
        return budget.budget_reached(self)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        lifecycle.save_state(self, checkpoint[CHECKPOINT_KEY])  # the counters, the source's state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        lifecycle.load_state(self, checkpoint.get(CHECKPOINT_KEY, {}))

    def log_completions(self, rollout: Rollout) -> None:
        """Sample completions (or episodes) as a TensorBoard text table on rank 0."""
        scoring.log_completions(self, rollout, self.num_logged_completions)
