"""Where an online method's responses come from: a `RolloutSource`, one object passed to the module.

An online module (`lit_rlhf.modules.online.OnlineModule`) takes its source as the `rollout`
argument (`rollout: {class_path: lit_rlhf.online.VLLMSampler}` in YAML; `HFSampler()` when none
is given). The source answers two questions, and the module does the rest (log-probs, rewards,
the rollout hook, the update):

- `sample(module, batch, repeats, sampling, training)`: the rollout's rows for a prompt batch,
  each prompt repeated `repeats` times (its copies contiguous), without log-probs or scores;
- `generate(module, prompt_ids, prompt_mask, sampling)`: one response per row, one turn
  (validation, ReMax's greedy baseline, an environment's policy turns).

A source holds the backend's settings (a vLLM engine's arguments, the staleness bound of
asynchronous rollouts, an environment) so a method's constructor carries only the method's. Its
`correction` (`lit_rlhf.online.correction.RolloutCorrection`; `tis_cap` is its token-truncate
shorthand) is the importance weighting or masking the update applies when the sampler is not
the trainer (`lit_rlhf.losses.rollout_correction`): None means off. A source with state worth a checkpoint
(the asynchronous queue) returns it from `state_dict` and takes it back in `load_state_dict`.

The sources here sample in this process: `HFSampler`, our KV-cache sampler on the policy itself
(the reference every other backend is tested against), and `VLLMSampler`, a vLLM engine
colocated in this process. `lit_rlhf.online.async_source.AsyncRollouts` samples ahead of the
learner; `lit_rlhf.online.environment.EnvironmentRollouts` runs multi-turn episodes.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.generation import SamplingConfig, generate_responses, needs_synced_gpus
from lit_rlhf.lightning_compat import attached_trainer
from lit_rlhf.models import adapters
from lit_rlhf.online.correction import RolloutCorrection, source_correction
from lit_rlhf.types import PromptBatch, Rollout

Responses = tuple[Tensor, Tensor, Tensor, "Tensor | None"]  # ids (N, R), mask (N, R), has_eos (N,), sampler logps


def repeated_prompts(batch: PromptBatch, repeats: int) -> tuple[Tensor, Tensor, dict[str, list[Any]]]:
    """The batch's left-padded prompts and meta columns, each prompt `repeats` times (contiguous)."""
    prompt_ids, prompt_mask = batch.input_ids, batch.attention_mask.bool()  # (B, P)
    meta = {k: list(v) for k, v in batch.meta.items()}
    if repeats > 1:
        prompt_ids = prompt_ids.repeat_interleave(repeats, dim=0)  # (B*G, P)
        prompt_mask = prompt_mask.repeat_interleave(repeats, dim=0)
        meta = {k: [x for x in v for _ in range(repeats)] for k, v in meta.items()}
    return prompt_ids, prompt_mask, meta


class RolloutSource:
    """Where a rollout's responses come from (see the module docstring). Subclasses define
    `generate`; the defaults sample one turn per row synchronously."""

    correction: RolloutCorrection | None = None
    """The correction of the sampler/trainer gap the update applies to the policy-gradient term
    (`lit_rlhf.online.correction`; None: off, the sampler is the trainer)."""
    asynchronous: bool = False
    """True when responses are sampled ahead of the learner (the method must correct stale samples)."""
    multi_turn: bool = False
    """True when a rollout row is an episode with environment tokens (the method must opt in)."""

    @property
    def tis_cap(self) -> float | None:
        """The correction's token-level truncation C (the `tis_cap` shorthand), else None."""
        return None if self.correction is None else self.correction.tis_cap

    def generate(self, module: Any, prompt_ids: Tensor, prompt_mask: Tensor, sampling: SamplingConfig) -> Responses:
        """One response per row of the left-padded `prompt_ids` (N, P), one turn."""
        raise NotImplementedError

    def sample(self, module: Any, batch: PromptBatch, repeats: int, sampling: SamplingConfig,
               training: bool = True) -> tuple[Rollout, dict[str, Tensor]]:
        """The rows of a rollout for `batch` (N = B * `repeats`), without log-probs or scores,
        and stats to log (`training`: False for validation)."""
        prompt_ids, prompt_mask, meta = repeated_prompts(batch, repeats)
        ids, mask, has_eos, sampler_logps = self.generate(module, prompt_ids, prompt_mask, sampling)
        return Rollout(prompt_ids, prompt_mask, ids, mask, has_eos, None, meta=meta, sampler_logps=sampler_logps), {}

    def problems(self, module: Any, trainer: Any) -> list[str]:
        """Why this source cannot serve `module` under `trainer` (start-up checks; empty if it can)."""
        return []

    def start(self, module: Any) -> None:
        """The fit's training starts (random states restored: `on_train_start`)."""

    def stop(self) -> None:
        """The fit ends or fails: release what the source started."""

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint must hold of the source (None: nothing)."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A checkpoint's `state_dict`, before `start`."""

    runtime: tuple[str, ...] = ()
    """Attributes that hold running things (an engine, a producer): never pickled with the module's
    settings (hparams, checkpoints), rebuilt on first use."""

    def __getstate__(self) -> dict[str, Any]:
        return {k: (None if k in self.runtime else v) for k, v in self.__dict__.items()}


class HFSampler(RolloutSource):
    """Our KV-cache sampler (`lit_rlhf.generation.hf`) on the policy itself, in this process:
    the reference backend. Under sharded strategies every rank keeps generating until all are
    done (`needs_synced_gpus`)."""

    def generate(self, module: Any, prompt_ids: Tensor, prompt_mask: Tensor, sampling: SamplingConfig) -> Responses:
        tokenizer = module.tokenizer
        synced = needs_synced_gpus(attached_trainer(module))
        return (*generate_responses(module.policy, prompt_ids, prompt_mask, sampling, tokenizer.eos_token_id,
                                    tokenizer.pad_token_id, synced_gpus=synced), None)


def checked_source(method: type, source: Any, temperature: float, logprob_temperature: float | None) -> RolloutSource:
    """`source` if `method` (an `OnlineModule` class) can train on what it gives: episodes only
    for a method that accepts them, a sampler correction (`correction`, `tis_cap`) only for one that applies it,
    and then at the sampling temperature."""
    name = method.__name__
    if not isinstance(source, RolloutSource):
        raise TypeError(f"rollout must be a lit_rlhf.online rollout source, got {type(source).__name__}")
    if source.multi_turn and not method.accepts_environment:
        raise ValueError(f"{name} does not run environments (EnvironmentRollouts): its loss is not one trajectory "
                         "per row; GRPO, PPO, RLOO and rejection sampling do")
    if source.correction is not None and not method.supports_tis:
        raise ValueError(f"{name} has no rollout correction (correction, tis_cap): the GRPO family, RLOO, PPO and "
                         "distillation do")
    scoring = temperature if logprob_temperature is None else float(logprob_temperature)
    if not scoring > 0:
        raise ValueError(f"logprob_temperature must be > 0 or null (= temperature), got {logprob_temperature}")
    if source.correction is not None and scoring != temperature:
        raise ValueError(f"the rollout correction weighs tokens by pi_train / pi_sampler, and the sampler's log-probs are at "
                         f"temperature {temperature}: logprob_temperature ({logprob_temperature}) must equal it")
    return source


class VLLMSampler(RolloutSource):
    """A vLLM engine colocated in this process (`lit_rlhf.generation.vllm`), holding a copy of
    the policy's weights (with LoRA: the base with the `policy` adapter merged), reloaded after
    every optimizer step. The update's log-probs are still the trainer's; the sampler's own are
    logged against them (`rollout/sampler_logprob_diff`).

    Args:
        engine_kwargs: keyword arguments of the engine (`VLLMEngine.from_policy`: `max_model_len`,
            `gpu_memory_utilization`, ... passed to `vllm.LLM`).
        tis_cap: truncated importance sampling: the policy-gradient term of each token weighed by
            min(pi_train / pi_sampler, tis_cap); the shorthand of `correction: {mode: truncate,
            level: token, upper: tis_cap}`. None or 0 = off.
        correction: the rollout correction (`lit_rlhf.online.correction.RolloutCorrection`:
            truncated or masked ratios per token, sequence or geometric mean; DeepSeek-V3.2's
            off-policy sequence mask); None = `tis_cap` decides. Not both.
    """

    runtime = ("engine",)

    def __init__(self, engine_kwargs: dict[str, Any] | None = None, tis_cap: float | None = None,
                 correction: RolloutCorrection | None = None) -> None:
        self.engine_kwargs = dict(engine_kwargs or {})
        self.correction = source_correction(tis_cap, correction)
        self.engine = None  # built on the first rollout

    def generate(self, module: Any, prompt_ids: Tensor, prompt_mask: Tensor, sampling: SamplingConfig) -> Responses:
        tokenizer = module.tokenizer
        return self.synced_engine(module).generate(prompt_ids, prompt_mask, sampling, tokenizer.eos_token_id,
                                                   tokenizer.pad_token_id)

    def synced_engine(self, module: Any):
        """The engine, built on first use, with the policy's weights of the current optimizer step."""
        from lit_rlhf.generation.vllm import VLLMEngine

        step = module.global_step if attached_trainer(module) is not None else 0
        adapter = adapters.POLICY if module.lora_config is not None else None
        if self.engine is None:
            self.engine = VLLMEngine.from_policy(module.policy, module.tokenizer, adapter=adapter, **self.engine_kwargs)
            self.engine.synced_step = step
        elif self.engine.synced_step != step:
            self.engine.sync_weights(module.policy, step, adapter=adapter)
        return self.engine
