"""A module's settings: attributes at run time, `hparams` as their record, rebuilt from a checkpoint.

- **Attributes.** Every module keeps its settings as attributes set in `__init__`
  (`self.num_generations`, `self.micro_batch_size`, `self.lr`, ...) and reads those at run time,
  never `self.hparams`: under `main.py fit` LightningCLI fills `hparams` with the arguments of
  the class the config names, so a value that class does not take would be missing there.
- **Pinning.** A subclass fixes a setting of its base in its `super().__init__` call:

      class PairGRPO(GRPOModule):
          def __init__(self, **kwargs):
              super().__init__(num_generations=2, **kwargs)

  The CLI offers every argument of the base but `num_generations` (jsonargparse follows
  `**kwargs` into the base and leaves out what the call fixes), and the module runs with 2.
- **Record.** `record_settings` (called once by `PolicyModule` and `RewardModule`) writes
  `hparams` (checkpoints, loggers): what the CLI gave (the config's arguments and `_class_path`),
  completed with the effective arguments of every `__init__` of the class chain, so a pinned
  setting is recorded with the value the run used.
- **Rebuild.** `rebuild_module` (the `_instantiator` `rebuilt_by_us` writes into every checkpoint's
  hyper-parameters, used by `load_from_checkpoint` and `python -m lit_rlhf.export`, which trust it
  first: `TrainingModule.load_from_checkpoint`) builds the
  class from the recorded values it takes as arguments, leaving out the pinned ones (its
  `__init__` sets them itself), and refuses a checkpoint whose pinned value the class now pins
  differently. (The logged hparams keep the CLI's `_instantiator`: a logger merges them with the
  DataModule's, which carry the same.)
"""

from __future__ import annotations

import types
from typing import Any

from lightning.pytorch.core.mixins import HyperparametersMixin
from lightning.pytorch.utilities.parsing import collect_init_args

INSTANTIATOR = f"{__name__}.rebuild_module"
LIGHTNING_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"


def record_settings(module: HyperparametersMixin, frame: types.FrameType, **resolved: Any) -> None:
    """Set `module.hparams` from `frame` (the `__init__` frame of the class that calls this):
    the CLI's arguments when LightningCLI builds the module, completed with the effective
    arguments of the whole `__init__` chain; `resolved` overrides (e.g. a resolved tokenizer name)."""
    module.save_hyperparameters(frame=frame)  # under LightningCLI: the config's arguments, `frame` unused
    effective: dict[str, Any] = {}
    for local_args in collect_init_args(frame, [], classes=(HyperparametersMixin,)):  # base first, the subclass last
        effective.update(local_args)
    recorded = dict(module.hparams)
    missing = {k: v for k, v in effective.items() if k not in recorded}  # pinned by a subclass's super() call
    module.save_hyperparameters({**recorded, **missing, **resolved})


def rebuilt_by_us(checkpoint: dict[str, Any]) -> None:
    """Name `rebuild_module` as the instantiator of the checkpoint's hyper-parameters (a copy of
    the module's hparams, written before `on_save_checkpoint`)."""
    hparams = checkpoint.get("hyper_parameters")
    if isinstance(hparams, dict):
        hparams["_instantiator"] = INSTANTIATOR


def constructor_arguments(cls: type) -> set[str] | None:
    """The arguments `cls(...)` takes as the CLI resolves them (jsonargparse follows `**kwargs`
    into the bases, without those a `super().__init__` call fixes); None when it cannot tell."""
    try:
        from jsonargparse import ArgumentParser

        names = ArgumentParser(exit_on_error=False).add_class_arguments(cls, "m", fail_untyped=False)
    except Exception:  # noqa: BLE001 - an unresolvable signature: every recorded value is passed
        return None
    return {name.split(".")[1] for name in names or ()}


def rebuild_module(cls: type, config: dict[str, Any]) -> Any:
    """`cls` rebuilt from the hyper-parameters `record_settings` wrote (the `_instantiator` of
    our checkpoints): the values `cls` takes as arguments, through LightningCLI's instantiator when
    the CLI built it (`_class_path`); the pinned ones must come out as recorded."""
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
