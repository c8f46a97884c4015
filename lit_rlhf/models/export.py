"""Export of scalar-head reward models to plain `transformers` formats.

`to_sequence_classifier` turns a `ScalarHeadModel` into an `AutoModelForSequenceClassification`
with one label, placing the head bias (D15) where plain `transformers` still sees it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from lit_rlhf.models.heads import ScalarHeadModel, backbone_of
from lit_rlhf.models.loading import disable_dropout


# Where the final norm of a backbone lives (its output is the `last_hidden_state` the head reads).
_FINAL_NORM_NAMES = ("final_layer_norm", "ln_f", "decoder.final_layer_norm", "norm", "final_norm")
REWARD_BIAS_KEY = "reward_bias"


def final_norm_of(backbone: nn.Module) -> tuple[str, nn.Module] | None:
    """(name, module) of the backbone's final normalisation layer, or None when not found."""
    modules = dict(backbone.named_modules())
    for name in _FINAL_NORM_NAMES:
        if name in modules:
            return name, modules[name]
    return None


def to_sequence_classifier(scalar: ScalarHeadModel, pad_token_id: int):
    """An `AutoModelForSequenceClassification` (num_labels=1) giving the rewards of `scalar` ->
    `(classifier, folded)`, sharing no tensors with `scalar`.

    Its heads have no bias, so the head bias `c` is folded into a final LayerNorm with a bias
    (GPT-NeoX, GPT-2, OPT: `b' = b + c * w / ||w||^2` gives `w . LN'(x) = w . LN(x) + c` exactly,
    `folded` True, `config.reward_bias = 0`); otherwise (RMSNorm: Llama, SmolLM2; a zero head) it is
    written to `config.reward_bias`, which `load_reward_model` adds back, and plain `transformers`
    returns `reward - reward_bias` (rankings and accuracies unchanged)."""
    from transformers import AutoModelForSequenceClassification

    backbone = scalar.backbone
    config = copy.deepcopy(backbone.config)
    config.num_labels = 1
    config.pad_token_id = pad_token_id
    config.architectures = None
    classifier = AutoModelForSequenceClassification.from_config(config, dtype=next(backbone.parameters()).dtype)
    body = backbone_of(classifier)
    body.load_state_dict(backbone.state_dict())
    weight = scalar.head.weight.detach()  # (1, d)
    bias = float(scalar.head.bias.detach().float()) if scalar.head.bias is not None else 0.0
    with torch.no_grad():
        classifier.score.weight.copy_(weight.to(classifier.score.weight.dtype))
    folded = False
    norm = final_norm_of(body)
    w = weight.double().reshape(-1)
    if bias != 0.0 and norm is not None and isinstance(norm[1], nn.LayerNorm) and norm[1].bias is not None:
        if float(w.dot(w)) > 0.0:
            with torch.no_grad():
                delta = bias * w / w.dot(w)  # (d,)
                norm[1].bias.copy_((norm[1].bias.double() + delta).to(norm[1].bias.dtype))
            folded = True
    classifier.config.pad_token_id = pad_token_id
    setattr(classifier.config, REWARD_BIAS_KEY, 0.0 if folded else bias)
    classifier.config.reward_bias_folded = folded
    return disable_dropout(classifier), folded
