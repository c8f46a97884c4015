"""Where an online method's responses come from: a `RolloutSource`, one object passed to the module.

An online module (`lit_rlhf.modules.online.OnlineModule`) takes its source as the `rollout`
argument (`rollout: {class_path: lit_rlhf.online.VLLMSampler}` in YAML; `HFSampler()` when none
is given). The source gives a rollout's rows (`sample`: each prompt `repeats` times, contiguous,
without log-probs or scores) and one response per row (`generate`: validation, ReMax's greedy
baseline, an environment's turns); the module does the rest. `model` is a `SampledModel`, what
the module says of the model to sample (`OnlineModule.sampled_model`).

**A second model.** `for_model(name)` is the source of another model's responses (`reference`, a
teacher, an opponent), sampled as this source samples the policy's: by the same engine kind, from
the same random streams, with the same checkpoint state (`HFSampler` is stateless; `VLLMSampler`
builds the frozen model its own engine, loaded once; `AsyncRollouts` runs it its own producer,
whose queue is saved with the policy's). `sample_models` lays the models' rows side by side per
prompt (XPO: the policy's response, then the reference's).

A source holds the backend's settings, so a method's constructor carries only the method's; its
`correction` (`lit_rlhf.online.correction.RolloutCorrection`, None = off) is what the update
applies when the sampler is not the trainer; a source with state worth a checkpoint (the
asynchronous queue) returns it from `state_dict`. Here: the interface and `HFSampler`, our
KV-cache sampler on the policy itself (the reference every other backend is tested against);
`vllm_source.VLLMSampler`, `async_source.AsyncRollouts` and `environment.EnvironmentRollouts`
are the others.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any, Sequence

import torch
from lightning import Trainer
from torch import Tensor, nn

from lit_rlhf.generation import SamplingConfig, generate_responses
from lit_rlhf.models import adapters
from lit_rlhf.online.correction import RolloutCorrection
from lit_rlhf.types import PromptBatch, Rollout

Responses = tuple[Tensor, Tensor, Tensor, "Tensor | None"]  # ids (N, R), mask (N, R), has_eos (N,), sampler logps


@dataclasses.dataclass(frozen=True)
class SampledModel:
    """The model a source samples (`OnlineModule.sampled_model`).

    Args:
        name: `policy`, or the name of another model (`reference`, a teacher): `for_model`'s key.
        model: the network (a `peft` model under LoRA; the reference on a LoRA policy's base is an
            `AdapterView`).
        tokenizer: its tokenizer (EOS and PAD, D3).
        adapter: the LoRA adapter that is the model (the policy's), else None.
        version: the rollouts the learner has trained on: the version of the policy's weights and
            the index of the rollout being sampled.
        synced_gpus: every rank generates until all are done (a sharded policy, `needs_synced_gpus`).
        frozen: the weights never change (a reference, a teacher): an engine never reloads them.
    """

    name: str
    model: nn.Module
    tokenizer: Any
    adapter: str | None = None
    version: int = 0
    synced_gpus: bool = False
    frozen: bool = False


def standalone(model: nn.Module) -> nn.Module:
    """`model` as a network of its own for an engine or a producer to copy: a LoRA reference (an
    `AdapterView` of the policy's base with no adapter) as a copy of the bare base."""
    if not isinstance(model, adapters.AdapterView) or model.adapter is not None:
        return model
    base = copy.deepcopy(model.model)
    adapters.forget_layers(base)
    return base.unload()


def side_by_side(rollouts: Sequence[Rollout]) -> Rollout:
    """Unscored rollouts of the same prompts, the same number of rows each, as one whose rows
    alternate: row i of the first, row i of the second, ... (a prompt's rows stay contiguous)."""

    def alternated(tensors: list[Tensor | None]) -> Tensor | None:
        return None if any(t is None for t in tensors) else torch.stack(tensors, dim=1).flatten(0, 1)

    names = ("prompt_ids", "prompt_mask", "response_ids", "response_attention_mask", "has_eos", "sampler_logps")
    merged = {name: alternated([getattr(r, name) for r in rollouts]) for name in names}
    meta = {key: [x for row in zip(*(r.meta[key] for r in rollouts)) for x in row] for key in rollouts[0].meta}
    return rollouts[0]._replace(**merged, meta=meta)


def repeated_prompts(batch: PromptBatch, repeats: int) -> tuple[Tensor, Tensor, dict[str, list[Any]]]:
    """The batch's left-padded prompts and meta columns, each prompt `repeats` times (contiguous)."""
    prompt_ids = batch.input_ids.repeat_interleave(repeats, dim=0)  # (B*G, P)
    prompt_mask = batch.attention_mask.bool().repeat_interleave(repeats, dim=0)
    meta = {k: [x for x in v for _ in range(repeats)] for k, v in batch.meta.items()}
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

    def generate(self, model: SampledModel, prompt_ids: Tensor, prompt_mask: Tensor,
                 sampling: SamplingConfig) -> Responses:
        """One response per row of the left-padded `prompt_ids` (N, P), one turn."""
        raise NotImplementedError

    def sample(self, model: SampledModel, batch: PromptBatch, repeats: int, sampling: SamplingConfig,
               training: bool = True) -> tuple[Rollout, dict[str, Tensor]]:
        """The rows of a rollout for `batch` (N = B * `repeats`), without log-probs or scores,
        and stats to log (`training`: False for validation)."""
        prompt_ids, prompt_mask, meta = repeated_prompts(batch, repeats)
        ids, mask, has_eos, sampler_logps = self.generate(model, prompt_ids, prompt_mask, sampling)
        return Rollout(prompt_ids, prompt_mask, ids, mask, has_eos, None, meta=meta, sampler_logps=sampler_logps), {}

    def sample_models(self, models: Sequence[SampledModel], batch: PromptBatch, repeats: int,
                      sampling: SamplingConfig, training: bool = True) -> tuple[Rollout, dict[str, Tensor]]:
        """`sample` for several models, each by its own source (`for_model`), `repeats /
        len(models)` rows each per prompt, their rows alternating (`side_by_side`); the stats are
        the first model's where two name the same."""
        if len(models) == 1:
            return self.sample(models[0], batch, repeats, sampling, training)
        if repeats % len(models):
            raise ValueError(f"{repeats} rows per prompt cannot be shared by {len(models)} models")
        parts = [self.for_model(m.name).sample(m, batch, repeats // len(models), sampling, training) for m in models]
        return side_by_side([r for r, _ in parts]), {k: v for _, stats in reversed(parts) for k, v in stats.items()}

    def for_model(self, name: str) -> "RolloutSource":
        """The source of model `name`'s responses (see the module docstring): this one for the
        policy, else made once (`sibling`) and kept in `siblings`, whose states travel with this one's."""
        if name == "policy":
            return self
        siblings = self.__dict__.setdefault("siblings", {})
        if name not in siblings:
            siblings[name] = self.sibling(name)
        return siblings[name]

    def sibling(self, name: str) -> "RolloutSource":
        """A source for the frozen model `name`, sampling as this one does (stateless: this one)."""
        return self

    def problems(self, trainer: Trainer | None, method: type, resamples: bool = False) -> list[str]:
        """Why this source cannot serve the online method `method` (a class) under `trainer`
        (start-up checks; empty if it can); `resamples`: the method samples again within a step
        (dynamic sampling)."""
        return []

    def start(self, model: SampledModel, trainer: Trainer, sampling: SamplingConfig, repeats: int) -> None:
        """The fit's training starts (random states restored: `on_train_start`); the source will
        sample `model`, `repeats` responses per prompt."""

    def stop(self) -> None:
        """The fit ends or fails: release what the source (and its siblings) started."""

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

    def generate(self, model: SampledModel, prompt_ids: Tensor, prompt_mask: Tensor,
                 sampling: SamplingConfig) -> Responses:
        eos, pad = model.tokenizer.eos_token_id, model.tokenizer.pad_token_id
        view = isinstance(model.model, adapters.AdapterView)  # a LoRA reference: the base, no adapter
        with adapters.activated(model.model) if view else contextlib.nullcontext(model.model) as network:
            return (*generate_responses(network, prompt_ids, prompt_mask, sampling, eos, pad,
                                        synced_gpus=model.synced_gpus), None)


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
