"""A trained reward model loaded back as a `ScalarHeadModel`: from a `RewardModule` checkpoint,
an exported one-label sequence classifier, or a LoRA reward model's adapter directory (D11, D12,
D15: the trained head and its bias come back with it).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from lit_rlhf.models.adapters import adapter_base_name, lora_config
from lit_rlhf.models.heads import ScalarHeadModel, _is_sequence_classifier, backbone_of, load_scalar_model
from lit_rlhf.models.loading import ModelNotFoundError, load_causal_lm, load_tokenizer
from lit_rlhf.models.scalar_adapters import is_scalar_adapter_dir, load_head, lora_scalar_model

log = logging.getLogger(__name__)


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
        config = lora_config(hparams["lora"])
        model, peft_model = lora_scalar_model(hparams["model"], tokenizer, dtype, config)
        model.load_state_dict(weights)
        peft_model.merge_and_unload()  # in place: model.backbone is left with plain linear layers
        return model
    model = load_scalar_model(hparams["model"], tokenizer, dtype)
    model.load_state_dict(weights)
    return model


def load_reward_model(name_or_ckpt: str, tokenizer=None, dtype: str | torch.dtype | None = None) -> ScalarHeadModel:
    """A trained reward model as a `ScalarHeadModel` in eval mode (gradients left enabled), from a
    `RewardModule` checkpoint (`.ckpt`: the base in its hyper-parameters rebuilt, the trained
    weights loaded, head bias included, D15), a directory exported by `RewardModule.export_hf` (or
    any one-label sequence classifier; `config.reward_bias` kept), or a LoRA reward model's adapter
    directory (its base with the adapter merged, and its head). Any other name gets a fresh D11 head,
    with a warning. Rewards: `.score(input_ids, attention_mask)` at the last real token (D12, D14)."""
    path = Path(str(name_or_ckpt)).expanduser()
    if is_scalar_adapter_dir(path):  # a LoRA reward model: its base with the adapter merged in
        from peft import PeftModel

        base_name = adapter_base_name(path)
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(base_name)
        merged = PeftModel.from_pretrained(load_causal_lm(base_name, tokenizer, dtype), str(path)).merge_and_unload()
        head = load_head(path, next(merged.parameters()).dtype)
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
