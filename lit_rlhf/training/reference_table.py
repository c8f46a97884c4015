"""A frozen reference's sequence log-probs computed once before training (DPO's
`precompute_ref_logps`), in a table keyed by each row's content, so the reference need not stay
in memory during the fit.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from lightning.pytorch.utilities import move_data_to_device
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor

from lit_rlhf import checks

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
def precompute_reference_logps(score: Callable[[Any], Tensor], dataloaders: Iterable[Iterable[Any]], device: torch.device,
                               trainer: Any = None, collective: bool = False) -> dict[bytes, float]:
    """`score(batch)`, a reference's sequence log-probs (N,) of a batch's rows, for every row of
    `dataloaders`, keyed by `sequence_keys`, under the trainer's precision. Each rank scores its
    own rows of a distributed loader and every world_size-th batch of any other (every batch when
    `collective`: each forward is a collective); the tables are merged on all ranks."""
    world_size = trainer.world_size if trainer is not None else 1
    rank = trainer.global_rank if trainer is not None else 0
    context = trainer.precision_plugin.forward_context() if trainer is not None else torch.autocast("cpu", enabled=False)
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
                batch = move_data_to_device(batch, device)
                logps = score(batch).float().tolist()  # (N,)
                table.update(zip(sequence_keys(batch.input_ids, batch.attention_mask, batch.loss_mask), logps))
    if world_size > 1:
        gathered: list[dict[bytes, float] | None] = [None] * world_size
        torch.distributed.all_gather_object(gathered, table)
        for part in gathered:
            table.update(part or {})
    return table


def export_overwrites_reference(reference: str, export_dir: str | None) -> str | None:
    """The problem when `export_dir` is the `reference` the table is rebuilt from, else None."""
    if not (export_dir and checks.same_path(reference, export_dir)):
        return None
    return (f"precompute_ref_logps=true rebuilds the reference table from {reference!r} on every (resumed) fit, "
            f"but export_dir={export_dir!r} writes the trained policy there: the reference would share the "
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
