"""DRO-V (Richemond et al. 2024): a policy and a value V(x) trained on single-trajectory,
scalar-reward data; the math is `lit_rlhf.losses.drov_loss`."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from lit_rlhf import checks, models
from lit_rlhf.models import adapters, scalar_adapters
from lit_rlhf.losses import batch_value_estimate, drov_loss
from lit_rlhf.modules.pairwise import OfflineModule
from lit_rlhf.training.optim import decay_groups
from lit_rlhf.types import SingleBatch

ValueForm = Literal["network", "batch_estimate", "policy_logit", "learned_scalar", "shared_head"]
VALUE_FORMS = ("network", "batch_estimate", "policy_logit", "learned_scalar", "shared_head")
HeadInit = Literal["zero", "d11"]
HEAD_INITS = ("zero", "d11")


def last_prompt_index(prompt_lengths: Tensor) -> Tensor:
    """Index of the last prompt token of right-padded prompt+completion rows: (B,) -> (B,)."""
    if (prompt_lengths < 1).any():
        raise ValueError(f"every row needs a non-empty prompt to read V(x) at; got prompt_lengths {prompt_lengths.tolist()}")
    return prompt_lengths.long() - 1


def distinct_prompts(prompt_groups: Tensor | None, size: int) -> tuple[Tensor, Tensor]:
    """(rows, inverse): the first row of each prompt group (K,) and each row's group (B,), so
    `values[inverse]` gives every row its prompt's V(x); without groups every row is its own."""
    if prompt_groups is None:
        every = torch.arange(size)
        return every, every
    _, inverse = torch.unique(prompt_groups.cpu(), return_inverse=True)  # (B,) in 0..K-1
    order = torch.arange(size)
    rows = torch.full((int(inverse.max()) + 1,), size, dtype=torch.long).scatter_reduce(0, inverse, order, "amin")
    device = prompt_groups.device
    return rows.to(device), inverse.to(device)


class DROVModule(OfflineModule):
    """DRO-V on `SingleBatch`es (prompt, completion, normalised scalar reward `rewards`).

    L = 1/2 E[(r(x,y) - V(x) - tau * log(pi(y|x)/pi_ref(y|x)))^2] (docs/methods/offline-preference.md);
    V(x) is read at the last prompt token, once per distinct prompt. Policy and value train in
    ONE AdamW with their own learning rates. The value's form (`value`): DRO-V, the paper's two
    ablations (Sec. 3.2, 3.3), then two of ours:
    - `network`: a separate network `value_model` (`None`: the policy's `model` with a fresh
      head; a reward model keeps its head), trained at `value_lr`; with `lora` and no
      `value_model`, the adapter `value` on the policy's frozen base.
    - `batch_estimate`: the paper's single value mean_b(r - tau log pi/pi_ref)
      (`losses.batch_value_estimate`): no parameters.
    - `policy_logit`: the paper's shared network, the policy's own logits as value outputs:
      V(x) = the raw logit of token `value_token_id` at the last prompt token, trained at the
      policy's `lr`. By default PAD's logit (ours: no completion token is PAD, D3, yet its
      logit moves the softmax normaliser of every token, the coupling this ablation is about).
    - `learned_scalar` (ours): one learnable scalar for all prompts, trained at `value_lr`.
    - `shared_head` (ours): a D11 scalar head on the policy's backbone (with `lora`, on the
      policy adapter); the value loss also moves the backbone; the head trains at `value_lr`.

    Args:
        tau: KL regularisation strength (> 0); the paper's default is 1.
        lr: policy learning rate (the paper uses 1e-4 for both networks, with 150 warmup steps).
        value_lr: value learning rate (its own AdamW parameter group; see `value`).
        value: the value's form (above); `network` by default.
        value_model: the value network's initial checkpoint (`value: network` only).
        value_token_id: the vocabulary id whose logit is V(x) (`value: policy_logit` only);
            `None` = the tokenizer's PAD id.
        value_head_init: how a fresh value head starts (`network` without `value_model`, and
            `shared_head`): `zero` (ours, the default): V(x) = 0, the normalised rewards' mean,
            for every prompt; `d11`: the reward head's N(0, 1/sqrt(d_model + 1)) (D11), a random
            start of about the hidden state's RMS (see the DRO miniature, `experiments/README.md`).
        value_warmup_steps: the first this many optimizer steps fit V alone (the policy gets no
            gradient); 0 (default): joint from the first step. Only for a value with parameters
            of its own (`network`, `learned_scalar`).
        ref_model: reference policy name; `None` = a frozen copy of the initial policy.
        **kwargs: `PolicyModule` arguments (model, tokenizer, dtype, optimiser, schedule, export).
            `gradient_checkpointing` applies to a separate value network as to the policy.
    """

    batch_types = (SingleBatch,)
    prog_bar_stats = ("objective/dro",)

    def __init__(
        self,
        tau: float = 1.0,
        lr: float = 1e-4,
        value_lr: float = 1e-4,
        value: ValueForm = "network",
        value_model: str | None = None,
        value_token_id: int | None = None,
        value_head_init: HeadInit = "zero",
        value_warmup_steps: int = 0,
        ref_model: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(lr=lr, **kwargs)
        if tau <= 0 or value_lr <= 0:
            raise ValueError(f"tau and value_lr must be > 0, got {tau}, {value_lr}")
        if value not in VALUE_FORMS:
            raise ValueError(f"unknown value {value!r}; expected one of {VALUE_FORMS}")
        if value != "network" and value_model is not None:
            raise ValueError(f"value_model names the checkpoint of value: network; got value={value!r} with "
                             f"value_model={value_model!r}")
        if value != "policy_logit" and value_token_id is not None:
            raise ValueError(f"value_token_id is read by value: policy_logit only; got value={value!r}")
        if value_head_init not in HEAD_INITS:
            raise ValueError(f"unknown value_head_init {value_head_init!r}; expected one of {HEAD_INITS}")
        if value_warmup_steps < 0:
            raise ValueError(f"value_warmup_steps must be >= 0, got {value_warmup_steps}")
        if value_warmup_steps and value not in ("network", "learned_scalar"):
            raise ValueError(f"value_warmup_steps fits a value with parameters of its own first (value: network or "
                             f"learned_scalar); value={value!r} has none apart from the policy's")
        self.tau, self.value_warmup_steps, self.value_form = tau, int(value_warmup_steps), value
        self.value_lr, self.value_model_name = value_lr, value_model
        self.value: models.ScalarHeadModel | None = None
        self.batch_value: nn.Parameter | None = None
        self.value_token_id: int | None = None
        if value == "learned_scalar":
            self.batch_value = nn.Parameter(torch.zeros(()))
        elif value == "policy_logit":
            self.value_token_id = self.tokenizer.pad_token_id if value_token_id is None else int(value_token_id)
            vocabulary = self.policy.get_output_embeddings().weight.shape[0]
            if self.value_token_id is None or not 0 <= self.value_token_id < vocabulary:
                raise ValueError(f"value_token_id {self.value_token_id} is not a vocabulary id of the policy "
                                 f"(0..{vocabulary - 1})")
        elif value == "shared_head" and self.lora_config is not None:  # a head on the policy adapter
            self.value = scalar_adapters.AdapterScalarModel(self.policy, adapters.POLICY)
        elif value == "shared_head":
            self.value = models.ScalarHeadModel(models.backbone_of(self.policy))
        elif value == "network" and self.lora_config is not None and (
            adapter := scalar_adapters.scalar_adapter(self.policy, adapters.VALUE, self.lora_config, value_model, self.model_name)
        ) is not None:  # LoRA: the adapter `value` on the policy's base (own learning rate)
            self.value = adapter
        elif value == "network":
            self.value = models.load_scalar_model(value_model or self.model_name, self.tokenizer, self.model_dtype)
            self.value.requires_grad_(True)
            if self.lora_config is not None:  # another base: a value adapter on its own frozen body
                scalar_adapters.lora_on_scalar(self.value, self.lora_config, adapters.VALUE)
        if value_head_init == "zero" and value in ("network", "shared_head") and value_model is None:
            with torch.no_grad():  # a fresh head: V(x) = 0 for every prompt at the start
                self.value.head.weight.zero_()
                if self.value.head.bias is not None:
                    self.value.head.bias.zero_()
        if self.gradient_checkpointing and value == "network":
            self.value.gradient_checkpointing_enable()  # trained like the policy: checkpointed too
        self.load_reference(ref_model, self.model_dtype)

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:
        """Also: the SingleBatches must carry scalar rewards."""
        problems = super().check_config(trainer, datamodule)
        if (datamodule is not None and checks.yields(datamodule, "SingleBatch")
                and getattr(datamodule, "with_rewards", True) is False):
            problems.append(f"{type(self).__name__} needs scalar rewards, but {type(datamodule).__name__} has "
                            "with_rewards=false: set with_rewards: true")
        return problems

    def value_parameters(self) -> list[nn.Parameter]:
        """The value's own trainable parameters (`shared_head`: the head only; none for
        `batch_estimate` and `policy_logit`)."""
        if self.value_form in ("batch_estimate", "policy_logit"):
            return []
        if self.batch_value is not None:
            return [self.batch_value]
        if self.value_form == "shared_head":
            return list(self.value.head.parameters())
        if isinstance(self.value, scalar_adapters.AdapterScalarModel):  # its LoRA weights and head
            return list(adapters.param_group_params(self.policy, self.value.adapter, self.value.head))
        return list(self.value.parameters())

    def values(self, batch: SingleBatch) -> Tensor:
        """V(x) of each row (B,), read at the last prompt token (not for `batch_estimate`)."""
        if self.value_form == "batch_estimate":
            raise ValueError("value: batch_estimate is computed from the batch's rewards and log-ratios "
                             "(losses.batch_value_estimate), not from the prompts")
        if self.batch_value is not None:
            return self.batch_value.expand(batch.input_ids.shape[0])  # (B,) one scalar for the batch
        rows, inverse = distinct_prompts(batch.prompt_groups, batch.input_ids.shape[0])  # (K,), (B,)
        index = last_prompt_index(batch.prompt_lengths[rows])  # (K,)
        width = int(index.max()) + 1  # right padding: prompts fill columns [0, prompt_length)
        ids, mask = batch.input_ids[rows, :width], batch.attention_mask[rows, :width]
        if self.value_form == "policy_logit":
            return self.policy_logit_values(ids, mask, index)[inverse]  # (B,)
        return self.value.score(ids, mask, index=index)[inverse]  # (B,)

    def policy_logit_values(self, input_ids: Tensor, attention_mask: Tensor, index: Tensor) -> Tensor:
        """The policy's logit of `value_token_id` at column `index` (B,) of each right-padded prompt
        (B, W); only the columns some row reads are computed (`logits_to_keep`)."""
        columns, row_column = torch.unique(index, return_inverse=True)  # (K,), (B,)
        with adapters.activated(self.policy) as module:
            logits = module(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=columns).logits  # (B, K, V)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        return logits[rows, row_column, self.value_token_id]  # (B,)

    def optimizer_param_groups(self) -> list[dict[str, Any]]:
        """Two learning rates in one AdamW: the policy at `lr`, the value at `value_lr`."""
        value_ids = {id(p) for p in self.value_parameters()}
        policy_params = nn.ParameterList([p for p in self.policy.parameters() if id(p) not in value_ids])
        if self.lora_config is not None:  # only the policy adapter (the value adapter is the value's)
            policy_params = adapters.param_group_params(self.policy, adapters.POLICY)
        value_params = nn.ParameterList(self.value_parameters())
        groups = decay_groups(policy_params, self.weight_decay, lr=self.lr, name="policy")
        groups += decay_groups(value_params, self.weight_decay, lr=self.value_lr, name="value")
        return groups

    def compute_loss(self, batch: SingleBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of one batch and the detached statistics to log (names `{group}/{name}`)."""
        if not isinstance(batch, SingleBatch):
            raise TypeError(f"DROVModule needs a SingleBatch with scalar rewards, got {type(batch).__name__}")
        if batch.rewards is None:
            raise ValueError("DROVModule needs scalar `rewards` in the batch (single-trajectory data with a reward column)")
        value_only = self.fitting_value_only()  # value warm-up: the policy gets no gradient
        with torch.set_grad_enabled(torch.is_grad_enabled() and not value_only):
            policy, ref = self.policy_and_ref_logps(batch.input_ids, batch.attention_mask, batch.loss_mask,
                                                    batch.sharing)  # (B,), (B,)
        if self.value_form == "batch_estimate":
            values = batch_value_estimate(policy.float(), ref.float(), batch.rewards.float(), self.tau)  # (B,)
        else:
            values = self.values(batch)  # (B,)
        out = drov_loss(policy, ref, values.float(), batch.rewards.float(), self.tau)
        stats = {
            "policy/loss": out.policy_loss.detach(),
            "value/loss": out.value_loss.detach(),
            "value/mean": out.values,
            "objective/dro": out.objective,
            "objective/logratio": out.logratio,
            "objective/advantages": out.advantages,
            "objective/residuals": out.residuals,
            "rewards/mean": batch.rewards.float().mean(),
            "value/fitting_only": torch.tensor(float(value_only)),
        }
        return out.loss, stats

    def fitting_value_only(self) -> bool:
        """True during the value warm-up (`value_warmup_steps`) of a training run."""
        return self.training and self.attached_trainer is not None and self.trainer.global_step < self.value_warmup_steps

    def training_step(self, batch: SingleBatch, batch_idx: int) -> Tensor | None:
        if not self.check_finite(batch, rewards=getattr(batch, "rewards", None)):
            return None  # on_nonfinite=skip: Lightning skips backward and the step
        return super().training_step(batch, batch_idx)
