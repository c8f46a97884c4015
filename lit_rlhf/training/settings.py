"""A module's settings: attributes at run time, `hparams` as their record, rebuilt from a checkpoint.

Every module keeps its settings as attributes set in `__init__` and reads those, never
`self.hparams`; a subclass may pin a setting of its base in its `super().__init__` call (the CLI
then leaves it out). `record_settings` writes `hparams`: the CLI's arguments completed with the
effective arguments of the `__init__` chain, pinned ones included. `rebuild_module` (the
checkpoints' `_instantiator`, for `load_from_checkpoint` and `python -m lit_rlhf.export`) builds
the class from them and refuses a checkpoint whose pinned value the class now pins differently.
"""

from __future__ import annotations

import types
from typing import Any

from lightning.pytorch.core.mixins import HyperparametersMixin
from lightning.pytorch.utilities.parsing import collect_init_args

INSTANTIATOR = f"{__name__}.rebuild_module"
LIGHTNING_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"


def record_settings(module: HyperparametersMixin, frame: types.FrameType, **resolved: Any) -> None:
    """Set `module.hparams` from `frame` (the calling `__init__`'s): the CLI's arguments, completed
    with the effective arguments of the `__init__` chain; `resolved` overrides."""
    module.save_hyperparameters(frame=frame)  # under LightningCLI: the config's arguments, `frame` unused
    effective: dict[str, Any] = {}
    for local_args in collect_init_args(frame, [], classes=(HyperparametersMixin,)):  # base first, the subclass last
        effective.update(local_args)
    recorded = dict(module.hparams)
    missing = {k: v for k, v in effective.items() if k not in recorded}  # pinned by a subclass's super() call
    module.save_hyperparameters({**recorded, **missing, **resolved})


def rebuilt_by_us(checkpoint: dict[str, Any]) -> None:
    """Name `rebuild_module` as the instantiator of the checkpoint's hyper-parameters."""
    hparams = checkpoint.get("hyper_parameters")
    if isinstance(hparams, dict):
        hparams["_instantiator"] = INSTANTIATOR


def constructor_arguments(cls: type) -> set[str] | None:
    """The arguments `cls(...)` takes as the CLI resolves them (through `**kwargs`, without the
    pinned ones); None when it cannot tell."""
    try:
        from jsonargparse import ArgumentParser

        names = ArgumentParser(exit_on_error=False).add_class_arguments(cls, "m", fail_untyped=False)
    except Exception:  # noqa: BLE001 - an unresolvable signature: every recorded value is passed
        return None
    return {name.split(".")[1] for name in names or ()}


def rebuild_module(cls: type, config: dict[str, Any]) -> Any:
    """`cls` rebuilt from the hyper-parameters `record_settings` wrote (through LightningCLI's
    instantiator when the CLI built it); the pinned ones must come out as recorded."""
    config = dict(config)
    taken = constructor_arguments(cls)
    pinned = {} if taken is None else {k: config.pop(k) for k in list(config) if not k.startswith("_") and k not in taken}
    if "_class_path" in config:
        from lightning.pytorch.cli import instantiate_module

        module = instantiate_module(cls, config)
    else:
        module = cls(**config)
    changed = [f"{k}={v!r} (now {module.hparams.get(k)!r})" for k, v in pinned.items() if module.hparams.get(k, v) != v]
    if changed:
        raise ValueError(f"{cls.__name__} now pins other values than the checkpoint was trained with: {', '.join(changed)}")
    return module
