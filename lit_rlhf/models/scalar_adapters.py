"""Scalar-head networks (reward, PPO value, DRO-V's V(x)) trained as LoRA adapters: one more named
adapter on the policy's frozen base with a head of its own (`scalar_adapter`,
`AdapterScalarModel`), or a separate scalar model whose body trains as an adapter
(`lora_on_scalar`, `lora_scalar_model`). A LoRA reward model is exported as its PEFT adapter with
the head beside it (`save_head`, `load_head`, `is_scalar_adapter_dir`); heads as D11, D12, D14.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from lit_rlhf.models.adapters import (
    REWARD, VALUE, adapter_base_name, add_lora, backbone, is_adapter_dir, load_adapter, set_trainable, use_adapter
)
from lit_rlhf.models.heads import ScalarHeadModel, _is_sequence_classifier, hidden_size, init_scalar_head
from lit_rlhf.models.loading import _resolve, load_causal_lm

HEAD_FILE = "scalar_head.safetensors"  # the scalar head saved next to a reward/value adapter
HEAD_CONFIG = "scalar_head.json"


def scalar_adapter(
    model: nn.Module,
    adapter: str,
    config,
    source: str | None = None,
    base_name: str | None = None,
    trainable: bool = True,
) -> AdapterScalarModel | None:
    """A scalar-head network as the adapter `adapter` on the shared base `model`: with `source` None
    a fresh adapter (`config`) and D11 head; with `source` a LoRA reward model exported by
    `RewardModule` on the same base (`base_name`), its adapter and head (D22: a value model starting
    from the reward model); anything else: None (the caller loads a separate model)."""
    if source is None:
        add_lora(model, config, adapter)
        head = None
    elif is_scalar_adapter_dir(source) and _same_base(adapter_base_name(source), base_name):
        load_adapter(model, source, adapter)
        head = load_head(Path(str(source)).expanduser())
    else:
        return None
    set_trainable(model, {adapter: trainable})
    scalar = AdapterScalarModel(model, adapter, head)
    scalar.head.requires_grad_(trainable)
    return scalar


def _same_base(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


class AdapterScalarModel(ScalarHeadModel):
    """A scalar-head model (reward, value) whose body is an adapter on a shared base.

    Only the head is a registered submodule: the base and its adapters belong to the policy's
    `PeftModel` (checkpointed, moved and sharded with it), so nothing is held twice. `forward`
    runs the backbone with exactly `adapter` active (D12, D14 as `ScalarHeadModel`)."""

    def __init__(self, peft_model: nn.Module, adapter: str, head: nn.Linear | None = None) -> None:
        nn.Module.__init__(self)
        object.__setattr__(self, "peft_model", peft_model)  # not a child: the policy owns it
        self.adapter = adapter
        self.config = peft_model.config
        if head is None:
            head = init_scalar_head(nn.Linear(hidden_size(peft_model), 1, bias=True))
        self.head = head.to(next(peft_model.parameters()).dtype)

    @property
    def backbone(self) -> nn.Module:
        return backbone(self.peft_model)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Nothing of its own to switch: the shared base is the policy's, which `PolicyModule`'s
        `gradient_checkpointing` checkpoints, each recomputation under the adapter of the forward
        it replays (`checkpoint_context_fn`)."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        with use_adapter(self.peft_model, self.adapter):
            return super().forward(input_ids, attention_mask)


def lora_on_scalar(scalar: ScalarHeadModel, config, adapter: str = VALUE) -> ScalarHeadModel:
    """Train a separate scalar-head model (a reward model on another base, or a full-weight one
    a value starts from, D22) as a LoRA adapter on its own frozen body, and its head in full."""
    body = add_lora(scalar.backbone, config, adapter)
    set_trainable(body, {adapter: True})
    scalar.backbone = body
    scalar.head.requires_grad_(True)
    return scalar


def lora_scalar_model(name: str, tokenizer, dtype, config, adapter: str = REWARD) -> tuple[ScalarHeadModel, nn.Module]:
    """A scalar-head model trained as a LoRA adapter: `(scalar, peft_model)`.

    The causal LM `name` is wrapped whole (so the saved adapter has the layout of a causal LM's
    and loads onto a policy's base), and the scalar model's body is its transformer body with
    the LoRA layers in; the head (D11) trains with the adapter."""
    kind, where = _resolve(name)
    if kind == "dir" and _is_sequence_classifier(Path(where)):
        raise ValueError(f"lora trains an adapter on a causal LM base; {name!r} is a sequence classifier "
                         "(give the causal LM it was trained from, or train it without lora)")
    peft_model = add_lora(load_causal_lm(name, tokenizer, dtype), config, adapter)
    set_trainable(peft_model, {adapter: True})
    scalar = ScalarHeadModel(backbone(peft_model))
    scalar.head.to(next(peft_model.parameters()).dtype)
    return scalar, peft_model


def save_head(head: nn.Linear, directory: Path, reward_bias: float | None = None) -> None:
    """Write a scalar head next to an adapter: `scalar_head.safetensors` (+ its bias in json)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"weight": head.weight.detach().float().contiguous().cpu()}
    if head.bias is not None:
        tensors["bias"] = head.bias.detach().float().contiguous().cpu()
    save_file(tensors, str(directory / HEAD_FILE))
    (directory / HEAD_CONFIG).write_text(json.dumps({"in_features": head.in_features, "reward_bias": reward_bias}))


def load_head(directory: Path, dtype: torch.dtype = torch.float32) -> nn.Linear:
    from safetensors.torch import load_file

    tensors = load_file(str(directory / HEAD_FILE))
    weight = tensors["weight"]
    head = nn.Linear(weight.shape[1], 1, bias="bias" in tensors)
    with torch.no_grad():
        head.weight.copy_(weight)
        if "bias" in tensors:
            head.bias.copy_(tensors["bias"])
    return head.to(dtype)


def is_scalar_adapter_dir(path: str | Path) -> bool:
    """A PEFT adapter saved with a scalar head (a LoRA reward model exported by `RewardModule`)."""
    path = Path(str(path)).expanduser()
    return is_adapter_dir(path) and (path / HEAD_FILE).is_file()
