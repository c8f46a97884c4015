"""LoRA with `peft`: named adapters on one frozen base model (`docs/guides/lora.md`).

The policy is the adapter `policy`, the reference the same base with every adapter disabled
(`AdapterView(model, None)`); PPO's value and reward models and DRO-V's V(x) are further adapters
with scalar heads (`lit_rlhf.models.scalar_adapters`). `use_adapter` activates exactly one adapter
by setting every LoRA layer's active adapter directly, never touching `requires_grad` (peft's
`set_adapter` / `disable_adapter` flip it, pulling parameters out of an optimizer, a DDP bucket
or a DeepSpeed partition mid-run); `checkpoint_context_fn` replays that state when gradient
checkpointing recomputes a forward. A LoRA config is a `peft.LoraConfig` by class path or the
short spec of `lora_config`.
"""

from __future__ import annotations

import copy
import importlib
import json
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator

from torch import nn

POLICY = "policy"
VALUE = "value"
REWARD = "reward"
_SPEC_KEYS = {"r", "alpha", "dropout", "target_modules", "modules_to_save"}


def lora_config(spec: Any):
    """A `peft.LoraConfig` from `spec`, or None when `spec` is None (no LoRA).

    `spec` is one of:
    - a `peft.LoraConfig`;
    - `{"class_path": "peft.LoraConfig", "init_args": {...}}` (the YAML class-path form);
    - the short spec, every key optional: `r` (rank, default 8), `alpha` (scaling numerator,
      default 2r), `dropout` (default 0: D7 keeps the ratio of PPO's first epoch exactly 1),
      `target_modules` (default `all-linear`: every linear layer but the output layer),
      `modules_to_save` (modules trained in full next to the adapter, default none).
    """
    from peft import LoraConfig

    if spec is None:
        return None
    if isinstance(spec, LoraConfig):
        return spec
    if not isinstance(spec, dict):
        raise TypeError(f"lora must be a mapping or a peft.LoraConfig, got {type(spec).__name__}: {spec!r}")
    if "class_path" in spec:
        module_name, _, class_name = str(spec["class_path"]).rpartition(".")
        cls = getattr(importlib.import_module(module_name or "peft"), class_name, None)
        if cls is None or not (isinstance(cls, type) and issubclass(cls, LoraConfig)):
            raise ValueError(f"lora.class_path must name peft.LoraConfig (or a subclass), got {spec['class_path']!r}")
        return cls(**dict(spec.get("init_args") or {}))
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise ValueError(f"unknown lora keys {unknown}; expected some of {sorted(_SPEC_KEYS)} or class_path/init_args")
    r = int(spec.get("r", 8))
    if r < 1:
        raise ValueError(f"lora.r must be >= 1, got {r}")
    dropout = float(spec.get("dropout", 0.0))
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"lora.dropout must be in [0, 1), got {dropout}")
    return LoraConfig(
        r=r,
        lora_alpha=float(spec.get("alpha", 2 * r)),
        lora_dropout=dropout,
        target_modules=spec.get("target_modules", "all-linear"),
        modules_to_save=spec.get("modules_to_save"),
        bias="none",
    )


def add_lora(model: nn.Module, config, adapter: str = POLICY):
    """Wrap `model` in a `peft.PeftModel` with the adapter `adapter`; the base is frozen."""
    from peft import PeftModel, get_peft_model

    if isinstance(model, PeftModel):
        model.add_adapter(adapter, copy.deepcopy(config))
    else:
        model = get_peft_model(model, copy.deepcopy(config), adapter_name=adapter)
    forget_layers(model)
    return model


def adapter_names(model: nn.Module) -> list[str]:
    """Names of the LoRA adapters on `model` (in the order they were added)."""
    config = getattr(model, "peft_config", None)
    return list(config) if isinstance(config, dict) else []


def _tuner_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = model.__dict__.get("_lit_rlhf_tuner_layers")
    if layers is None:
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        model.__dict__["_lit_rlhf_tuner_layers"] = layers  # not an attribute nn.Module tracks
    return layers


def forget_layers(model: nn.Module) -> None:
    """Drop the cached list of LoRA layers (after adding an adapter)."""
    model.__dict__.pop("_lit_rlhf_tuner_layers", None)


def _state(model: nn.Module) -> list[tuple[Any, bool]]:
    return [(layer._active_adapter, layer._disable_adapters) for layer in _tuner_layers(model)]


def _restore(model: nn.Module, state: list[tuple[Any, bool]]) -> None:
    for layer, (active, disabled) in zip(_tuner_layers(model), state):
        layer._active_adapter = active
        layer._disable_adapters = disabled


@contextmanager
def use_adapter(model: nn.Module, adapter: str | None) -> Iterator[nn.Module]:
    """Run the calls inside with exactly the adapter `adapter` active (None: the bare base).

    Only the active-adapter switches of the LoRA layers change; `requires_grad` is untouched, and
    the previous state comes back on exit."""
    saved = _state(model)
    try:
        for layer in _tuner_layers(model):
            if adapter is None:
                layer._disable_adapters = True
            else:
                layer._active_adapter = [adapter]
                layer._disable_adapters = False
        yield model
    finally:
        _restore(model, saved)


def checkpoint_context_fn(model: nn.Module):
    """`context_fn` for non-reentrant `torch.utils.checkpoint`: the recomputation in backward runs
    with the adapters that were active in the forward pass it replays."""

    def context_fn():
        state = _state(model)

        @contextmanager
        def replay():
            current = _state(model)
            _restore(model, state)
            try:
                yield
            finally:
                _restore(model, current)

        return nullcontext(), replay()

    return context_fn


def adapter_parameters(model: nn.Module, adapter: str) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of the LoRA weights of `adapter` on `model`."""
    marker = f".{adapter}."
    return [(n, p) for n, p in model.named_parameters() if "lora_" in n and marker in n]


def set_trainable(model: nn.Module, trainable: dict[str, bool]) -> None:
    """Freeze the base; train exactly the adapters marked True (here or by an earlier call).

    peft switches `requires_grad` when it adds or loads an adapter; this puts every adapter
    back to what the module decided, and leaves the layers' active adapter at the first one
    (the policy)."""
    marks = model.__dict__.setdefault("_lit_rlhf_trainable", {})
    marks.update(trainable)
    for _, param in model.named_parameters():
        param.requires_grad_(False)
    for adapter, train in marks.items():
        for _, param in adapter_parameters(model, adapter):
            param.requires_grad_(train)
    forget_layers(model)
    first = next(iter(marks))
    for layer in _tuner_layers(model):
        layer._active_adapter = [first]
        layer._disable_adapters = False


def param_group_params(model: nn.Module, adapter: str, extra: nn.Module | None = None) -> nn.ParameterList:
    """The trainable parameters of one network on the shared base: its adapter's LoRA weights
    (and `extra`'s, e.g. its scalar head), for one optimizer parameter group."""
    params = [p for _, p in adapter_parameters(model, adapter) if p.requires_grad]
    if extra is not None:
        params += [p for p in extra.parameters() if p.requires_grad]
    return nn.ParameterList(params)


def backbone(model: nn.Module) -> nn.Module:
    """The transformer body (no output layer) under a `PeftModel` of a causal LM, LoRA layers in."""
    from peft import PeftModel

    inner = model.get_base_model() if isinstance(model, PeftModel) else model
    body = getattr(inner, "base_model", None)
    if body is None or body is inner:
        raise ValueError(f"cannot find the backbone of {type(inner).__name__}")
    return body


class AdapterView:
    """The shared base seen with one adapter active (or none: the reference policy).

    Not an `nn.Module`: it owns no weights, so nothing freezes, moves or checkpoints the base
    through it. Calls run under `use_adapter`; `lit_rlhf.modules.policy.PolicyModule` unwraps it
    (`activated`) before asking for log-probs, so the chunked path sees the real model."""

    def __init__(self, model: nn.Module, adapter: str | None) -> None:
        self.model = model
        self.adapter = adapter

    def __call__(self, *args, **kwargs):
        with use_adapter(self.model, self.adapter):
            return self.model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with use_adapter(self.model, self.adapter):
            return self.model.generate(*args, **kwargs)

    def eval(self) -> "AdapterView":
        return self

    def train(self, mode: bool = True) -> "AdapterView":
        return self

    def parameters(self):
        return self.model.parameters()

    @property
    def config(self):
        return self.model.config

    def __repr__(self) -> str:
        return f"AdapterView(adapter={self.adapter!r})"


@contextmanager
def activated(model: Any) -> Iterator[nn.Module]:
    """Yield the module to call for `model`: an `AdapterView`'s base with its adapter active,
    any other module as it is."""
    if isinstance(model, AdapterView):
        with use_adapter(model.model, model.adapter) as inner:
            yield inner
    else:
        yield model


def is_adapter_dir(path: str | Path) -> bool:
    """True when `path` is a PEFT adapter directory (an `adapter_config.json`)."""
    path = Path(str(path)).expanduser()
    return path.is_dir() and (path / "adapter_config.json").is_file()


def adapter_base_name(path: str | Path) -> str | None:
    """The base model name recorded in an adapter's config (`base_model_name_or_path`)."""
    config = json.loads((Path(str(path)).expanduser() / "adapter_config.json").read_text())
    return config.get("base_model_name_or_path")


def load_adapter(model: nn.Module, path: str | Path, adapter: str):
    """Load a saved PEFT adapter as `adapter` onto `model` (wrapping it in a PeftModel if needed)."""
    from peft import PeftModel

    path = str(Path(str(path)).expanduser())
    if isinstance(model, PeftModel):
        model.load_adapter(path, adapter_name=adapter)
        forget_layers(model)
        return model
    return PeftModel.from_pretrained(model, path, adapter_name=adapter, is_trainable=True)


def merged_copy(model: nn.Module, adapter: str) -> nn.Module:
    """A plain `transformers` model: a copy of the base with `adapter` merged into its weights.

    The training model is left untouched (the copy is merged and unloaded, the other adapters
    dropped)."""
    clone = copy.deepcopy(model)
    forget_layers(clone)
    for name in adapter_names(clone):
        if name != adapter:
            clone.delete_adapter(name)
    return clone.merge_and_unload(adapter_names=[adapter])


def save_adapter(model: nn.Module, directory: Path, adapter: str, base_name: str | None = None) -> Path:
    """Write `adapter` alone in PEFT format to `directory` (loadable by `PeftModel.from_pretrained`
    on the base; `base_model_name_or_path` records `base_name`). Returns `directory`."""
    import tempfile

    directory.mkdir(parents=True, exist_ok=True)
    config = model.peft_config[adapter]
    previous = config.base_model_name_or_path
    if base_name is not None:
        config.base_model_name_or_path = base_name
    try:
        with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
            model.save_pretrained(tmp, selected_adapters=[adapter], safe_serialization=True)
            written = Path(tmp) / adapter if adapter != "default" else Path(tmp)
            for item in written.iterdir():
                item.replace(directory / item.name)
    finally:
        config.base_model_name_or_path = previous
    return directory
