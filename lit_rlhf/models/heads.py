"""Scalar-head models: reward models (D11, D12, D14), PPO value models (D22), DRO-V's V(x).

`ScalarHeadModel` is a transformer body with a linear head giving one number per position;
`load_scalar_model` builds one from any model name `lit_rlhf.models.loading` accepts (keeping the
head of an exported one-label sequence classifier), and `load_reward_model` loads a trained reward
model from a `RewardModule` checkpoint or an exported directory.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
from torch import nn

from lit_rlhf.models.loading import (
    ModelNotFoundError,
    _finish,
    _parse_dtype,
    _resolve,
    load_causal_lm,
    load_tokenizer,
)

log = logging.getLogger(__name__)

def init_scalar_head(head: nn.Linear) -> nn.Linear:
    """D11: weights ~ N(0, 1/sqrt(d_model + 1)), bias 0."""
    std = 1.0 / math.sqrt(head.in_features + 1)
    with torch.no_grad():
        head.weight.normal_(0.0, std)
        if head.bias is not None:
            head.bias.zero_()
    return head


def hidden_size(model: nn.Module) -> int:
    config = model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text_config.hidden_size)


# --------------------------------------------------------------------------------------------
# scalar-head models: reward models (D11, D12, D14), PPO value models (D22), DRO-V's V(x)
# --------------------------------------------------------------------------------------------


class ScalarHeadModel(nn.Module):
    """A transformer backbone with a linear scalar head: one number per position.

    `forward` returns the head's output at every position (B, T); `score` reads it at one index
    per row, by default the last real token (the EOS of a response, D12), which is right for
    left- and right-padded rows alike (D14). The head has a bias so that D15 (reward
    normalisation) can shift the reward of reference responses to mean 0.
    """

    def __init__(self, backbone: nn.Module, head: nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        self.head = head if head is not None else init_scalar_head(nn.Linear(hidden_size(backbone), 1, bias=True))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        from lit_rlhf.ops import position_ids_from_mask

        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask.long(),
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
        hidden = out.last_hidden_state  # (B, T, d)
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)  # (B, T)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute the backbone's activations in the backward pass (non-reentrant
        `torch.utils.checkpoint` by default); the head is one linear layer, kept as it is."""
        kwargs = {"use_reentrant": False} if gradient_checkpointing_kwargs is None else gradient_checkpointing_kwargs
        self.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Scalar at `index` (B,) or, by default, at the last True of `attention_mask` (D12)."""
        from lit_rlhf.ops import last_true_index

        values = self(input_ids, attention_mask)  # (B, T)
        if index is None:
            index = last_true_index(attention_mask.bool())
        return values.gather(1, index.unsqueeze(1)).squeeze(1)


def backbone_of(causal_lm: nn.Module) -> nn.Module:
    """The transformer body of a causal LM (or sequence classifier), without its output head."""
    body = getattr(causal_lm, "base_model", None)
    if body is None or body is causal_lm:
        raise ValueError(f"cannot find the backbone of {type(causal_lm).__name__}")
    return body


def _is_sequence_classifier(location: Path) -> bool:
    import json

    config_file = location / "config.json"
    if not config_file.is_file():
        return False
    architectures = json.loads(config_file.read_text()).get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in architectures)


def load_scalar_model(name: str, tokenizer=None, dtype: str | torch.dtype | None = None) -> ScalarHeadModel:
    """A `ScalarHeadModel` from any accepted model name.

    A directory holding an `AutoModelForSequenceClassification` with one label (e.g. a reward
    model exported by `RewardModule`) keeps its head (and the `reward_bias` our export records in
    its config, see `RewardModule.export_hf`); any other causal LM gets a fresh head with the D11
    initialisation.
    """
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(name)
    kind, where = _resolve(name)
    if kind == "dir" and _is_sequence_classifier(Path(where)):
        from transformers import AutoModelForSequenceClassification

        classifier = AutoModelForSequenceClassification.from_pretrained(where, dtype=_parse_dtype(dtype))
        if classifier.config.num_labels != 1:
            raise ValueError(f"{name!r} is a classifier with {classifier.config.num_labels} labels; a reward model has 1")
        classifier = _finish(classifier, tokenizer)
        head = nn.Linear(hidden_size(classifier), 1, bias=True).to(classifier.score.weight.dtype)
        with torch.no_grad():
            head.weight.copy_(classifier.score.weight)
            head.bias.fill_(float(getattr(classifier.config, "reward_bias", 0.0)))
        return ScalarHeadModel(backbone_of(classifier), head)
    causal_lm = load_causal_lm(name, tokenizer, dtype)
    return ScalarHeadModel(backbone_of(causal_lm))


def _reward_model_from_checkpoint(path: Path, tokenizer=None, dtype: str | torch.dtype | None = None) -> ScalarHeadModel:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    hparams = checkpoint.get("hyper_parameters") or {}
    state = checkpoint.get("state_dict") or {}
    prefix = "reward_model."
    weights = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not weights or "model" not in hparams:
        raise ValueError(
            f"{path} is not a RewardModule checkpoint: it needs hyper_parameters.model and "
            f"'{prefix}*' weights (found {len(weights)} such weights, hyper_parameters {sorted(hparams)})"
        )
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(hparams.get("tokenizer") or hparams["model"])
    dtype = dtype if dtype is not None else hparams.get("dtype")
    if hparams.get("lora") is not None:  # trained as a LoRA adapter: rebuild it, load, merge
        from lit_rlhf.models import adapters

        config = adapters.lora_config(hparams["lora"])
        model, peft_model = adapters.lora_scalar_model(hparams["model"], tokenizer, dtype, config)
        model.load_state_dict(weights)
        peft_model.merge_and_unload()  # in place: model.backbone is left with plain linear layers
        return model
    model = load_scalar_model(hparams["model"], tokenizer, dtype)
    model.load_state_dict(weights)
    return model


def load_reward_model(name_or_ckpt: str, tokenizer=None, dtype: str | torch.dtype | None = None) -> ScalarHeadModel:
    """A trained reward model as a `ScalarHeadModel` (in eval mode; gradients left enabled).

    `name_or_ckpt` is either
    - a `RewardModule` Lightning checkpoint (`.ckpt` file): the base model named in its
      hyper-parameters is rebuilt and the trained weights (head bias included, D15) loaded; or
    - a directory exported by `RewardModule.export_hf` (or any one-label
      `AutoModelForSequenceClassification`): its head and `config.reward_bias` are kept;
    - a LoRA reward model's adapter directory (`<export_dir>/adapter`: PEFT adapter and
      `scalar_head.safetensors`): the base it names, with the adapter merged in, and its head.
    Any other model name gets a fresh D11 head (with a warning: it is not a trained reward model).
    Rewards are read with `.score(input_ids, attention_mask)` at the last real token (D12, D14).
    """
    path = Path(str(name_or_ckpt)).expanduser()
    from lit_rlhf.models import adapters

    if adapters.is_scalar_adapter_dir(path):  # a LoRA reward model: its base with the adapter merged in
        from peft import PeftModel

        base_name = adapters.adapter_base_name(path)
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(base_name)
        merged = PeftModel.from_pretrained(load_causal_lm(base_name, tokenizer, dtype), str(path)).merge_and_unload()
        head = adapters.load_head(path, next(merged.parameters()).dtype)
        return ScalarHeadModel(backbone_of(merged), head).eval()
    if path.suffix == ".ckpt":
        if not path.is_file():
            raise ModelNotFoundError(f"reward model checkpoint {path} does not exist")
        model = _reward_model_from_checkpoint(path, tokenizer, dtype)
    else:
        model = load_scalar_model(str(name_or_ckpt), tokenizer, dtype)  # raises first when nothing loads
        if not (path.is_dir() and _is_sequence_classifier(path)):
            log.warning("%r is not an exported reward model or a RewardModule checkpoint: its scalar head "
                        "is freshly initialised (D11), so its rewards are random", str(name_or_ckpt))
    return model.eval()
