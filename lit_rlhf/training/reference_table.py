"""A frozen reference's sequence log-probs computed once before training (DPO's
`precompute_ref_logps`), in a table keyed by each row's content, so the reference need not stay
in memory during the fit.
"""

from __future__ import annotations

import gc
import hashlib
import logging
from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch.utilities import move_data_to_device
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torch.distributed.tensor import DTensor

from lit_rlhf import checks, models
from lit_rlhf.lightning_compat import attached_trainer
from lit_rlhf.models import adapters
from lit_rlhf.types import PreferenceBatch

log = logging.getLogger(__name__)


def sequence_keys(input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> list[bytes]:
    """A 16-byte fingerprint per row, (B, T) x3 -> B keys: a hash of its real tokens and of which
    are scored, independent of padding, position, split and order (valid across epochs, ranks
    and resumed runs)."""
    ids, keep, scored = input_ids.detach().cpu(), attention_mask.detach().cpu().bool(), loss_mask.detach().cpu().bool()
    keys = []
    for row_ids, row_keep, row_scored in zip(ids, keep, scored):
        digest = hashlib.blake2b(digest_size=16)
        digest.update(row_ids[row_keep].to(torch.int64).numpy().tobytes())
        digest.update(row_scored[row_keep].numpy().tobytes())
        keys.append(digest.digest())
    return keys


@torch.no_grad()
def precompute_reference_logps(module: Any, dataloaders: Iterable[Iterable[PreferenceBatch]]) -> dict[bytes, float]:
    """The sequence log-probs of a reference for every row of `dataloaders`, keyed by
    `sequence_keys`. The reference is `module.ref_model_name` or its `model` checkpoint, loaded
    here and freed at the end (with LoRA and no `ref_model_name`: the policy's base, adapter
    off). Each rank scores its own rows of a distributed loader and every world_size-th batch of
    any other; the tables are merged on all ranks."""
    if module.ref_model_name is None and getattr(module, "lora_config", None) is not None:
        ref = adapters.AdapterView(module.policy, None)  # LoRA: the policy's base, adapter disabled
    else:
        ref = models.load_reference_model(module.ref_model_name or module.model_name, module.tokenizer, module.model_dtype)
        ref.to(module.device)
    trainer = attached_trainer(module)
    world_size = trainer.world_size if trainer is not None else 1
    rank = trainer.global_rank if trainer is not None else 0
    context = trainer.precision_plugin.forward_context() if trainer is not None else torch.autocast("cpu", enabled=False)
    # a shared LoRA base under FSDP2 / ZeRO-3: every forward is a collective, every rank runs every batch
    collective = isinstance(ref, adapters.AdapterView) and any(
        isinstance(p, DTensor) or hasattr(p, "ds_id") for p in module.policy.parameters())
    table: dict[bytes, float] = {}
    step = 0
    with context:
        for loader in dataloaders:
            # a distributed sampler (the train loader) yields this rank's own rows; others are split here
            own_rows = getattr(getattr(loader, "sampler", None), "num_replicas", 1) > 1
            for batch in loader:
                step += 1
                if not (own_rows or collective) and (step - 1) % world_size != rank:
                    continue
                batch = move_data_to_device(batch, module.device)
                per_token = module.model_logps(ref, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                               sharing=batch.sharing)  # (2B, T)
                logps = module.sequence_logps(per_token, batch.loss_mask).float().tolist()  # (2B,)
                table.update(zip(sequence_keys(batch.input_ids, batch.attention_mask, batch.loss_mask), logps))
    if world_size > 1:
        gathered: list[dict[bytes, float] | None] = [None] * world_size
        torch.distributed.all_gather_object(gathered, table)
        for part in gathered:
            table.update(part or {})
    del ref
    gc.collect()
    if module.device.type == "cuda":
        torch.cuda.empty_cache()
    return table


def export_overwrites_reference(module: Any) -> str | None:
    """The problem when the run's `export_dir` is the reference the table is rebuilt from, else None."""
    reference = module.ref_model_name or module.model_name
    if not (module.export_dir and checks.same_path(reference, module.export_dir)):
        return None
    return (f"precompute_ref_logps=true rebuilds the reference table from {reference!r} on every (resumed) fit, "
            f"but export_dir={module.export_dir!r} writes the trained policy there: the reference would share the "
            "policy's weights. Export elsewhere, or set ref_model to a copy of the initial checkpoint")


def datamodule_loaders(trainer: Any, names: tuple[str, ...]) -> list:
    """The loaders the trainer's DataModule defines among `names` (e.g. `train_dataloader`)."""
    datamodule = trainer.datamodule
    if datamodule is None:
        raise RuntimeError(
            "precompute_ref_logps=true needs a LightningDataModule (trainer.fit(model, datamodule=...)), "
            "or call `precompute_reference(dataloaders)` yourself before fitting"
        )
    loaders = []
    for name in names:
        if is_overridden(name, datamodule):
            loader = getattr(datamodule, name)()
            loaders.extend(loader if isinstance(loader, (list, tuple)) else [loader])
    return loaders
