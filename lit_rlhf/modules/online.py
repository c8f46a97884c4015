"""Shared plumbing of the online methods (PPO, GRPO): rollouts, reward sources, the rollout hook.

One training step of an online method is one rollout followed by several optimizer steps:

1. **generate** (`make_rollout`): the PromptBatch's left-padded prompts (each repeated
   `repeats` times, GRPO's G) are sampled with the `SamplingConfig` built from the init args
   (temperature, top-k, top-p, `max_new_tokens` new tokens), with the KV cache, without grad,
   in eval mode; responses are cut after the first EOS and PAD-filled (D23). Under sharded
   strategies every rank keeps generating until all are done (`needs_synced_gpus`).
2. **score once**: the policy's log-probs of the sampled tokens under `logprob_temperature` (the
   sampling temperature unless set apart)
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
   scores of the same shape; it may also just observe. Before the hooks, a method adds its own
   per-row data (`rollout_extras` -> `rollout.extras`); a method whose extras are responses of
   their own (ReMax's greedy baselines, `greedy_rollout`) passes those through the hooks too,
   so they are shaped as the samples are. `callbacks.EOSTrickCallback` (D23) uses
   it; `callbacks.KLControlCallback` observes `on_rollout_end` instead (step 5).
5. **update** (`update`, per method): manual optimization over minibatches of the rollout with
   gradient accumulation over micro-batches, gradient clipping (`max_grad_norm`) and one
   learning-rate scheduler step per optimizer step (`run_updates`). It returns the rollout
   (with `logps` filled if it computed them) and its stats; then every callback that defines
   `on_rollout_end(trainer, pl_module, rollout) -> None` observes the final rollout (the KL
   controller measures the rollout's KL there). A non-finite score,
   value, loss or gradient never reaches the weights: it raises an error naming the step, or
   skips the optimizer step with `on_nonfinite: skip` (`PolicyModule.check_finite`).

A run is measured in **episodes** (sampled responses), which also size the learning-rate
schedule (`total_episodes`: `online_episodes`).

A method's settings are attributes (`lit_rlhf.modules.settings`); its update's split is checked
at start-up from `num_minibatches` and `update_rows` (`online_update`).

With `max_staleness` set, step 1 runs ahead of the learner in a producer with its own copy of the
policy, and the training step takes its responses from a versioned queue
(`online_async.AsyncRolloutMixin`); steps 2-5 are the same.

Where the code is: steps 1-4 and validation sampling are `online_rollout.RolloutMixin`, step
5's loop is `online_update.UpdateLoopMixin`, multi-turn episodes `online_env`, asynchronous
rollouts `online_async`, the episode budget, schedule length and checkpointed counters
`online_episodes`; this file holds `OnlineModule` itself (its arguments, what a method defines,
the training step).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy
from torch import Tensor

from lit_rlhf.data.packing import padding_fraction
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.modules.policy import PolicyModule
from lit_rlhf.envs.base import Environment
from lit_rlhf.modules.online_async import AsyncRolloutMixin
from lit_rlhf.modules.online_env import EnvironmentMixin
from lit_rlhf.modules.online_episodes import EpisodeBudgetMixin
from lit_rlhf.modules.online_rollout import RolloutMixin, repeat_meta, validation_rng
from lit_rlhf.modules.online_update import UpdateLoopMixin
from lit_rlhf.rewards import RewardNormalization
from lit_rlhf.types import PromptBatch, Rollout

__all__ = ["EpisodeBudgetMixin", "OnlineModule", "RolloutMixin", "UpdateLoopMixin", "repeat_meta", "validation_rng"]


class OnlineModule(AsyncRolloutMixin, EnvironmentMixin, RolloutMixin, UpdateLoopMixin, EpisodeBudgetMixin,
                   PolicyModule):
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
        temperature: sampling temperature (`lit_rlhf.ops.apply_temperature`). 1.0 here (the
            policy's own distribution); each method declares its paper's default (PPO 0.7, GRPO
            and RLOO 1.0). Also the log-prob temperature unless `logprob_temperature` is set.
        top_k: top-k sampling (0 = off).
        top_p: nucleus sampling (1.0 = off).
        val_temperature: sampling temperature of the validation responses; None = `temperature`.
            The N+ paper evaluates its TL;DR policies at 0.01 (near greedy). Validation log-probs
            (the KL) stay at `logprob_temperature`, the distribution the KL penalty regularises.
        logprob_temperature: the temperature of every log-prob the method trains on (old, new,
            reference: ratios, KL, loss); None = `temperature`, the distribution sampled (N+). Set
            it apart to train another one, e.g. a DPO loss at 1.0 on responses sampled at 0.7.
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
            with `lora`, the base with the policy adapter merged), or `vllm_server` (a vLLM engine in
            its own process, for asynchronous rollouts: needs `max_staleness`; `online_async`).
            Either way the update's log-probs are the trainer's; with `vllm` the sampler's own
            are logged against them (`rollout/sampler_logprob_diff`, mean and max of
            |log pi_train - log pi_sampler| over the response tokens).
        vllm_kwargs: keyword arguments of the vLLM engine (`VLLMEngine.from_policy`:
            `max_model_len`, `gpu_memory_utilization`, ... passed to `vllm.LLM`; for a server the
            trainer starts, its command-line flags: `lit_rlhf.generation.server.server_command`).
        tis_cap: truncated importance sampling (`losses.tis`): GRPO's and PPO's policy-gradient
            term of each token is weighted by min(pi_train / pi_sampler, tis_cap). None = off,
            except with `max_staleness` > 0, where it is `ASYNC_TIS_CAP` (2); 0 = off. Needs a
            sampler other than the trainer: `generation_backend: vllm` or `max_staleness`.
        environment: a `lit_rlhf.envs.Environment` (e.g. `lit_rlhf.envs.ToolEnvironment` with
            tools): each rollout row is then a multi-turn episode instead of one response
            (`lit_rlhf.modules.online_env`); the environment's return is the reward source
            `environment`, after the others (count it in `reward_weights`). None = one response
            per row. Synchronous rollouts only.
        max_turns: policy turns per episode at most (with an environment); `max_new_tokens`
            bounds each turn.
        max_episode_tokens: tokens after the first prompt per episode at most, the policy's and
            the environment's (the rollout's response width R); None = `max_turns *
            max_new_tokens`. An episode that would pass it is truncated (`has_eos` False).
        max_staleness: None (default) = synchronous rollouts, sampled inside the training step.
            An int s >= 0 = asynchronous rollouts: a producer samples each prompt batch ahead of
            the learner with the policy s versions (rollouts) back, at most s + 1 batches in
            flight (`online_async`); 0 is the synchronous run, bitwise.
        async_timeout: seconds the learner waits for a batch of asynchronous rollouts (and a
            checkpoint for the batches it holds), a vLLM server takes to start and any call to
            it takes, before it raises.
        server_url: `generation_backend: vllm_server`: the running server to sample from
            (`python -m lit_rlhf.generation.server`); None = the trainer starts one.
        weight_transfer: how a `vllm_server` gets full weights: `file` (a safetensors file stamped
            with its version: one machine or a shared disk) or `nccl` (GPUs: vLLM's NCCL weight
            transfer, `lit_rlhf.generation.server_nccl`); a LoRA adapter always goes as a file.
        server_concurrency: completion requests kept in flight on a `vllm_server` (its engine
            batches them); 1 runs them one at a time, so a row's numerics never depend on its
            batch-mates and a resumed run is the uninterrupted one bitwise (tested).
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
        num_logged_completions: int = 4,
        generation_backend: Literal["hf", "vllm", "vllm_server"] = "hf",
        vllm_kwargs: dict[str, Any] | None = None,
        tis_cap: float | None = None,
        environment: Environment | None = None,
        max_turns: int = 1,
        max_episode_tokens: int | None = None,
        max_staleness: int | None = None,
        async_timeout: float = 600.0,
        server_url: str | None = None,
        weight_transfer: Literal["file", "nccl"] = "file",
        server_concurrency: int = 64,
        **kwargs: Any,
    ) -> None:
        if generation_backend not in ("hf", "vllm", "vllm_server"):
            raise ValueError(f"generation_backend must be 'hf', 'vllm' or 'vllm_server', got {generation_backend!r}")
        # a new name: the argument itself stays as given (hparams record the init args)
        scoring_temperature = temperature if logprob_temperature is None else float(logprob_temperature)
        if not scoring_temperature > 0:
            raise ValueError(f"logprob_temperature must be > 0 or null (= temperature), got {logprob_temperature}")
        super().__init__(**kwargs)
        tis_cap = self.init_async(max_staleness, async_timeout, server_url, weight_transfer, generation_backend, tis_cap,
                                  server_concurrency)
        if tis_cap is not None and scoring_temperature != temperature:
            raise ValueError(f"tis_cap weights tokens by pi_train / pi_sampler, and the sampler's log-probs are at "
                             f"temperature {temperature}: logprob_temperature ({logprob_temperature}) must equal it")
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
        if reward_model is None and not self.reward_fns and environment is None:
            raise ValueError("no reward source: set reward_model and/or reward_fns (or an environment)")
        n_sources = int(reward_model is not None) + len(self.reward_fns) + int(environment is not None)
        if reward_weights is not None and len(reward_weights) != n_sources:
            raise ValueError(
                f"reward_weights has {len(reward_weights)} entries for {n_sources} reward sources "
                "(the reward model first, then reward_fns in order, then the environment)"
            )
        self.init_environment(environment, max_turns, max_episode_tokens, max_new_tokens)
        if reward_normalization not in ("none", "group", "batch"):
            raise ValueError(f"reward_normalization must be 'none', 'group' or 'batch', got {reward_normalization!r}")
        # the settings, read at run time (`lit_rlhf.modules.settings`)
        self.reward_model_name, self.ref_model_name = reward_model, ref_model
        self.reward_weights, self.reward_normalization = reward_weights, reward_normalization
        self.micro_batch_size, self.max_grad_norm = micro_batch_size, max_grad_norm
        self.lr_schedule_per, self.total_episodes = lr_schedule_per, total_episodes
        self.log_completions_every_n_steps, self.num_logged_completions = log_completions_every_n_steps, num_logged_completions
        self.generation_backend, self.vllm_kwargs, self.tis_cap = generation_backend, dict(vllm_kwargs or {}), tis_cap
        self.logprob_temperature_setting = logprob_temperature  # read as `logprob_temperature` (RolloutMixin)
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

    kl_coef: float = 0.0
    """The coefficient of the KL to the reference, one name for every method (the papers' beta:
    Ziegler et al. 2019 and N+ for PPO, DeepSeekMath for GRPO, Ahmadian et al. 2024 for RLOO). A
    method sets it from its `kl_coef` argument; `KLControlCallback` moves it with `set_kl_coef`."""

    def init_kl(self, kl_coef: float) -> None:
        """In `__init__`: the reference model only when the KL coefficient is > 0, then the coefficient."""
        if kl_coef > 0:
            self.load_reference(self.ref_model_name, self.model_dtype)
        self.set_kl_coef(kl_coef)

    def set_kl_coef(self, value: float) -> None:
        """Set the KL coefficient (>= 0): the hook through which `callbacks.KLControlCallback`
        controls it. A coefficient > 0 needs the reference model, which a method with `kl_coef` 0
        never loaded."""
        value = float(value)
        if not value >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {value}")
        if value > 0 and getattr(self, "ref_model", None) is None:
            raise ValueError(f"{type(self).__name__} was built with kl_coef 0 and loaded no reference model; "
                             f"a KL coefficient of {value} needs one: give the module kl_coef > 0")
        self.kl_coef = value

    def updates_per_rollout(self) -> int:
        """Optimizer steps the method's `update` takes on each rollout (the number of
        `run_updates` minibatch steps: passes x minibatches; PPO `ppo_epochs * num_minibatches`,
        GRPO `num_iterations * num_minibatches`). The schedule's length, the episode budget and
        the progress bar's rollout count are derived from it, so a method whose update takes
        another number of steps must say so here. Default 1: one on-policy step per rollout
        (RLOO, ReMax, online DPO)."""
        return 1

    def rollout_values(self, input_ids: Tensor, attention_mask: Tensor, response_length: int) -> Tensor | None:
        """Values (N, R) of the rollout's states (PPO); None when the method has no critic."""
        return None

    @property
    def needs_rollout_logps(self) -> bool:
        """Whether the rollout must carry the policy's sampling-time log-probs (`rollout.logps`)
        before the update: a forward pass over all N rows. False when the update is on-policy
        and computes them in its own forward pass (GRPO with one pass over one minibatch), or
        when the method never uses them (rejection sampling: an NLL on the kept rows). Without
        them the rollout's `logps` stays None, and the entropy and KL stats, and adaptive KL
        control, are not available."""
        return True

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        """Optimise on one shaped rollout (its per-row extras in `rollout.extras`); returns the
        rollout (with `logps` filled in if the update computed them for every row, else as it
        came) and the stats to log (names `group/name`)."""
        raise NotImplementedError

    def setup(self, stage: str) -> None:
        super().setup(stage)
        # Under DeepSpeed the engine clips inside its step and Lightning's `clip_gradients` does
        # nothing: hand it `max_grad_norm` (read when the engine is built, after this hook).
        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, DeepSpeedStrategy) and self.max_grad_norm:
            strategy.config.setdefault("gradient_clipping", float(self.max_grad_norm))

    # ------------------------------------------------------------------------------------------
    # the training step
    # ------------------------------------------------------------------------------------------

    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        started = time.perf_counter()
        rollout, per_source, sampling_stats = self.collect_rollout(batch)
        generated = time.perf_counter()
        rollout, stats = self.update(rollout)
        if self.lr_schedule_per == "rollout":
            self.step_lr_schedule()
        updated = time.perf_counter()
        self.notify_rollout_end(rollout)

        n = rollout.response_ids.shape[0]
        self.rollouts += 1
        self.episodes += n * max(1, self._trainer.world_size if self._trainer else 1)
        stats.update(self.rollout_stats(rollout))
        stats.update(self.episode_stats(rollout))
        stats.update(sampling_stats)
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

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass  # tokens/s and the padding fraction are logged by training_step (prompt + response tokens)
