"""Scalar-head models (a transformer body and a linear head, one number per position): reward
models (D11, D12, D14), PPO value models (D22), DRO-V's V(x). A trained reward model is loaded
back by `lit_rlhf.models.reward_loading`.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from lit_rlhf.models.loading import (_finish, _parse_dtype, _resolve, load_causal_lm, load_tokenizer)
from lit_rlhf.models.output_layer import forward_hidden


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


class ScalarHeadModel(nn.Module):
    """A transformer backbone with a linear scalar head: `forward` gives (B, T), one number per
    position; `score` reads it at the last real token (D12, D14). The head's bias lets D15 shift
    the reward of reference responses to mean 0.
    """

    def __init__(self, backbone: nn.Module, head: nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        self.head = head if head is not None else init_scalar_head(nn.Linear(hidden_size(backbone), 1, bias=True))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = forward_hidden(self.backbone, input_ids, attention_mask)  # (B, T, d)
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
    """A `ScalarHeadModel` from any model name `lit_rlhf.models.loading` accepts: a one-label
    sequence classifier's directory (e.g. `RewardModule.export_hf`'s) keeps its head and
    `reward_bias`; any other causal LM gets a fresh D11 head."""
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
