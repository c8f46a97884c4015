"""`PolicyModule`: what every policy-training method shares (SFT, DPO, KTO, DRO-V, PPO, GRPO).

The policy (`self.policy`) and its tokenizer, loaded by `lit_rlhf.models` with PAD != EOS (D3)
and dropout off (D7), or a LoRA adapter on a frozen base; frozen models (`add_frozen`: a
reference, a reward model; eval mode, no gradients, rebuilt from their names, never saved); the
one place modules get per-token log-probs (`model_logps`, `response_token_logps`: right under
either padding side, D5, chunked, a shared prompt computed once); the AdamW groups and the export.
Its base `TrainingModule` holds the optimiser, the guard, exact resume, checks and logging. A
subclass keeps its settings as attributes read at run time, never `self.hparams`, and may pin a
base setting in its `super().__init__(...)` call (`lit_rlhf.training.settings`).
"""

from __future__ import annotations

import inspect
import logging
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lit_rlhf import models
from lit_rlhf.models import adapters, scalar_adapters
from lit_rlhf.models.output_layer import decide_at_fit_start
from lit_rlhf.models.shared_prompt import decide_layout, grouped_token_logps, token_logps_with_grad
from lit_rlhf.training.base import TrainingModule
from lit_rlhf.training.memory import Memory
from lit_rlhf.training.moved import refuse_moved
from lit_rlhf.training.optim import SchedulerName, decay_groups
from lit_rlhf.training.settings import record_settings
from lit_rlhf.ops import masked_sum
from lit_rlhf.types import PromptSharing

log = logging.getLogger(__name__)


class PolicyModule(TrainingModule):
    """Base class of every method. The family bases (`PairwiseModule`, `OnlineModule`, `SFTModule`,
    `KTOModule`, `DROVModule`) implement `training_step` and `validation_step`; a method subclasses one.

    Args:
        model: the policy: a builtin name (`tiny-random-llama`, `smollm2-135m-instruct`), a local
            directory, a `.gguf` file or a hub id (see `lit_rlhf.models`).
        tokenizer: tokenizer name; defaults to `model`.
        dtype: dtype the weights are loaded in (`float32`, `bfloat16`, `float16`); mixed precision
            is the trainer's `precision` (`bf16-mixed` on `float32` weights). Trainable bf16/fp16
            weights are refused (no fp32 master copy) unless DeepSpeed trains or the precision
            is `bf16-true` / `16-true`.
        lr: peak learning rate of AdamW.
        weight_decay: AdamW weight decay (not applied to biases and norm weights).
        adam_eps: AdamW epsilon (the N+ paper uses 1e-5).
        adam_betas: AdamW betas.
        warmup_steps: linear warmup length in optimizer steps; `warmup_ratio` is used when 0.
        warmup_ratio: warmup as a fraction of the total number of optimizer steps.
        lr_scheduler: decay after warmup: `cosine`, `linear` (both to 0) or `constant`.
        export_dir: when set, the policy is exported there in Hugging Face format at the end of fit.
        on_nonfinite: what a NaN/inf loss, reward, advantage or gradient does before the optimizer
            step: `error` (default) stops with an error naming the step, the tensor and the batch
            rows; `skip` skips that optimizer step and counts it (`train/guard/skipped_steps`).
        lora: train LoRA adapters on a frozen base (`peft`): a `peft.LoraConfig` by
            `class_path`/`init_args`, or the short spec `r`, `alpha`, `dropout`, `target_modules`,
            `modules_to_save` (`lit_rlhf.models.adapters.lora_config`); the reference is the base
            with the adapter disabled, other networks further adapters on it. `null`: full fine-tuning.
        memory: how compute is traded for memory, never what is computed
            (`lit_rlhf.training.Memory`: `gradient_checkpointing`, `logprob_chunk_size`,
            `shared_prompt`, `frozen_placement`, `optimizer_in_backward`, `release_host_memory`).

    Class attributes:
        batch_types: the batch classes `training_step` consumes (e.g. `(PreferenceBatch,)`); the
            start-up checks refuse a DataModule yielding anything else. Empty = not checked.
    """

    logprob_filter: tuple[int, float] = (0, 1.0)
    """(top_k, top_p) the policy's log-probs replay (`response_token_logps`): the sampler's, set by
    an online module whose log-probs are of its sampling temperature; (0, 1.0) is no filter."""

    def __init__(
        self,
        model: str = models.TINY_RANDOM_LLAMA,
        tokenizer: str | None = None,
        dtype: str = "float32",
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        adam_eps: float = 1e-8,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        warmup_ratio: float = 0.0,
        lr_scheduler: SchedulerName = "cosine",
        export_dir: str | None = None,
        on_nonfinite: Literal["error", "skip"] = "error",
        lora: dict[str, Any] | None = None,
        memory: Memory | None = None,
        **moved: Any,
    ) -> None:
        refuse_moved(type(self), moved)
        super().__init__()
        # hparams: the effective init args of the whole class chain, pinned ones included
        # (`lit_rlhf.training.settings`). The CLI gives the DataModule `tokenizer or model`: record
        # the same resolved name, or a logger refuses to merge the two hparams ("tokenizer")
        record_settings(self, inspect.currentframe(), tokenizer=tokenizer or model)
        self.set_training_settings(lr=lr, weight_decay=weight_decay, adam_eps=adam_eps, adam_betas=adam_betas,
                                   warmup_steps=warmup_steps, warmup_ratio=warmup_ratio, lr_scheduler=lr_scheduler,
                                   export_dir=export_dir, on_nonfinite=on_nonfinite, memory=memory)
        self.model_name = model
        self.model_dtype = dtype  # the dtype the weights are loaded in (`self.dtype` is Lightning's, of the module)
        self.tokenizer_name = tokenizer or model  # the DataModule's tokenizer follows it (`lit_rlhf.cli`)
        self.tokenizer = models.load_tokenizer(self.tokenizer_name)
        self.policy = models.load_causal_lm(model, self.tokenizer, dtype)
        self.lora_config = adapters.lora_config(lora)
        if self.lora_config is not None:  # the policy is the adapter `policy` on a frozen base
            self.policy = adapters.add_lora(self.policy, self.lora_config, adapters.POLICY)
            adapters.set_trainable(self.policy, {adapters.POLICY: True})
        if self.gradient_checkpointing:
            kwargs = {"use_reentrant": False}
            if self.lora_config is not None:  # recompute under the adapter of the original forward
                kwargs["context_fn"] = adapters.checkpoint_context_fn(self.policy)
                self.policy.enable_input_require_grads()
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        self._frozen_names: list[str] = []
        self._whole_frozen: dict[str, nn.Module] = {}  # frozen models kept out of the module tree

    # frozen models (reference policy, reward model): never trained, never checkpointed

    def add_frozen(self, name: str, module: nn.Module) -> nn.Module:
        """Register `module` as a frozen submodule `self.<name>` (eval mode, no grads, not saved).

        With `frozen_placement: whole` it is reachable as `self.<name>` but kept out of the module
        tree, so a sharding strategy never partitions it; `_apply` still moves and casts it with
        the module (`.to(device)`, `.bfloat16()`).
        """
        module.eval()
        module.requires_grad_(False)
        if self.frozen_placement == "whole":
            self._whole_frozen[name] = module
            object.__setattr__(self, name, module)
        else:
            setattr(self, name, module)
        if name not in self._frozen_names:
            self._frozen_names.append(name)
        return module

    def load_reference(self, name: str | None, dtype: str = "float32") -> nn.Module:
        """The reference policy: `name` loaded fresh, or a frozen copy of the initial policy;
        with LoRA (and no `name`) the policy's own base with its adapters disabled."""
        if name is None and self.lora_config is not None:
            view = adapters.AdapterView(self.policy, None)  # no second copy of the base
            object.__setattr__(self, "ref_model", view)  # owns no weights: not a submodule
            return view
        ref = models.frozen_copy(self.policy) if name is None else models.load_reference_model(name, self.tokenizer, dtype)
        return self.add_frozen("ref_model", ref)

    def load_reward_source(self, name: str) -> nn.Module:
        """The reward model `name` for `add_frozen`: with LoRA, a LoRA reward model exported on
        the policy's base (`<export_dir>/adapter`) becomes the frozen adapter `reward` on the
        shared base (`lit_rlhf.models.scalar_adapters.scalar_adapter`); anything else is loaded as a
        separate model (`lit_rlhf.models.load_reward_model`)."""
        if self.lora_config is not None:
            scalar = scalar_adapters.scalar_adapter(self.policy, adapters.REWARD, self.lora_config, name, self.model_name,
                                             trainable=False)
            if scalar is not None:
                return scalar
        return models.load_reward_model(name, self.tokenizer, dtype=self.model_dtype)

    def load_value_model(self, source: str | None) -> nn.Module:
        """A trained scalar network beside the policy (PPO's value model): started from the reward
        model `source` (D22) or, without one, the policy's backbone with a fresh D11 head. With
        LoRA: the adapter `value` on the policy's own base where `source` allows it (a LoRA reward
        model exported on that base), else a value adapter on the loaded model's frozen body.
        Gradient-checkpointed when the policy is."""
        value = None
        if self.lora_config is not None:
            value = scalar_adapters.scalar_adapter(self.policy, adapters.VALUE, self.lora_config, source, self.model_name)
        if value is None and source is None:
            value = models.load_scalar_model(self.model_name, self.tokenizer, self.model_dtype)
        elif value is None:
            value = models.load_reward_model(source, self.tokenizer, dtype=self.model_dtype)
            if self.lora_config is not None:
                scalar_adapters.lora_on_scalar(value, self.lora_config, adapters.VALUE)
        if self.gradient_checkpointing:
            value.gradient_checkpointing_enable()
        return value

    def policy_and_value_groups(self, value: nn.Module, value_lr: float) -> list[dict[str, Any]]:
        """AdamW groups of the policy (at `lr`) and of a `load_value_model` network (at
        `value_lr`); on one LoRA base each adapter's weights (and the value's head) only."""
        wd = self.weight_decay
        if isinstance(value, scalar_adapters.AdapterScalarModel):
            policy = adapters.param_group_params(self.policy, adapters.POLICY)
            value = adapters.param_group_params(self.policy, adapters.VALUE, value.head)
        else:
            policy = self.policy
        return decay_groups(policy, wd, name="policy") + decay_groups(value, wd, name="value", lr=value_lr)

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        for module in getattr(self, "_whole_frozen", {}).values():  # not children: moved and cast here
            module._apply(fn, *args, **kwargs)
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        for name in self._frozen_names:  # frozen models stay in eval mode (D7)
            getattr(self, name).eval()
        return self

    def _frozen_prefixes(self) -> tuple[str, ...]:
        return tuple(f"{name}." for name in self._frozen_names)

    def _rebuilt_keys(self) -> set[str]:
        """With LoRA: the state-dict keys of every frozen parameter (the base, a frozen reward
        adapter), rebuilt from their names like the frozen models, so checkpoints hold the
        trained adapters and heads only."""
        if getattr(self, "lora_config", None) is None:
            return set()
        return {name for name, param in self.named_parameters(remove_duplicate=False) if not param.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        prefixes, rebuilt = self._frozen_prefixes(), self._rebuilt_keys()
        if (prefixes or rebuilt) and "state_dict" in checkpoint:
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items()
                                        if not (k.startswith(prefixes) if prefixes else False) and k not in rebuilt}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Frozen models (and, with LoRA, the frozen base) are not in checkpoints: keep the ones
        this module was built with."""
        prefixes, rebuilt = self._frozen_prefixes(), self._rebuilt_keys()
        if prefixes or rebuilt:
            state_dict = dict(state_dict)
            for key, value in super().state_dict().items():
                if key not in state_dict and ((prefixes and key.startswith(prefixes)) or key in rebuilt):
                    state_dict[key] = value
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # log-probs

    def on_fit_start(self) -> None:
        """The base's start, then what each step's log-probs read, decided per causal LM once placed
        and sharded: its chunked path (`decide_at_fit_start`, a forward every rank runs) and the
        shared-prompt layout (`decide_layout`)."""
        super().on_fit_start()
        ids = torch.arange(8, device=self.device)[None]  # the chunked path's probe, a few tokens
        for model in self.log_prob_models():
            if self.logprob_chunk_size:
                decide_at_fit_start(model, ids)
            if self.shared_prompt:
                decide_layout(model)

    def log_prob_models(self) -> list[nn.Module]:
        """The causal LMs (models that `generate`) log-probs may run on: the policy, frozen ones (a
        reference, a teacher), the base under a LoRA adapter view."""
        views = [v for v in vars(self).values() if isinstance(v, adapters.AdapterView)]  # not submodules
        bases = [*self.children(), *self._whole_frozen.values(), *(view.model for view in views)]
        return list({id(m): m for m in bases if callable(getattr(m, "generate", None))}.values())

    def model_logps(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor,
                    temperature: float = 1.0, sharing: PromptSharing | None = None) -> Tensor:
        """Per-token log-probs (B, T) of a causal LM on the tokens where `loss_mask` is True (0
        elsewhere), chunked or dense as `logprob_chunk_size` says; with `shared_prompt` on, each
        prompt `sharing` names is computed once (the same values)."""
        active = adapters.activated(model) if isinstance(model, adapters.AdapterView) else nullcontext(model)
        with active as module:  # a LoRA adapter on the shared base: run with it active
            return grouped_token_logps(module, input_ids, attention_mask, loss_mask,
                                       sharing if self.shared_prompt else None, temperature, self.logprob_chunk_size)

    def policy_logps(self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, temperature: float = 1.0,
                     sharing: PromptSharing | None = None) -> Tensor:
        """Per-token log-probs (B, T) of the policy on the tokens where `loss_mask` is True."""
        return self.model_logps(self.policy, input_ids, attention_mask, loss_mask, temperature, sharing)

    @torch.no_grad()
    def frozen_logps(self, name: str, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, temperature: float = 1.0,
                     sharing: PromptSharing | None = None) -> Tensor:
        """Per-token log-probs (B, T) of a frozen causal LM (e.g. `ref_model`), without grad."""
        return self.model_logps(getattr(self, name), input_ids, attention_mask, loss_mask, temperature, sharing)

    def response_token_logps(self, model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                             response_mask: Tensor, temperature: float = 1.0, micro_batch_size: int | None = None,
                             groups: Tensor | None = None) -> Tensor:
        """Log-probs (B, R) of sampled responses under `model` (`token_logps_with_grad`); `groups` (B,)
        names rows with the same prompt, computed once with `shared_prompt` on. The policy's replay
        the sampler's top-k / top-p (`logprob_filter`), any other model's are of the full vocabulary."""
        top_k, top_p = self.logprob_filter if model is self.policy else (0, 1.0)
        active = adapters.activated(model) if isinstance(model, adapters.AdapterView) else nullcontext(model)
        with active as module:  # a LoRA adapter on the shared base: run with it active
            return token_logps_with_grad(module, prompt_ids, prompt_mask, response_ids, response_mask, temperature,
                                         micro_batch_size, self.logprob_chunk_size, top_k, top_p,
                                         groups if self.shared_prompt else None)

    @staticmethod
    def sequence_logps(per_token: Tensor, mask: Tensor) -> Tensor:
        """Sum of per-token log-probs over the kept tokens: (B, T) -> (B,)."""
        return masked_sum(per_token, mask, dim=1)

    # optimisation

    def optimizer_param_groups(self) -> list[dict[str, Any]]:
        """Parameter groups for AdamW; override to add models or learning rates (e.g. DRO-V's value)."""
        return decay_groups(self.policy, self.weight_decay)

    # export

    def export_hf(self, directory: str | Path) -> Path:
        """Write the policy and tokenizer with `save_pretrained` (loadable by plain transformers).

        With LoRA: the base with the `policy` adapter merged in `directory` (plain transformers),
        and the adapter alone in PEFT format in `directory/adapter` (`PeftModel.from_pretrained`
        on the base, `lit_rlhf.models.load_causal_lm(directory/adapter)`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.lora_config is not None:
            adapters.merged_copy(self.policy, adapters.POLICY).save_pretrained(directory, safe_serialization=True)
            adapters.save_adapter(self.policy, directory / "adapter", adapters.POLICY, base_name=self.model_name)
        else:
            self.policy.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        log.info("exported %s to %s", type(self).__name__, directory)
        return directory
