"""The train loader's sampler: a new permutation every epoch, this rank's share of it, and an exact
mid-epoch resume (`ResumableSampler`)."""

from __future__ import annotations

import logging
from typing import Any

from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)


class ResumableSampler(DistributedSampler):
    """The train order: a permutation of the rows drawn from `seed + epoch` (a new one every epoch,
    D21; never the global generator), rank r's share rows r, r+W, ... (a `DistributedSampler`, so
    Lightning keeps it under DDP/DeepSpeed), and on a resumed run without the batches of the
    current epoch already trained on.

    Exact mid-epoch resume: when iteration starts (at the first `next()`), the batches the trainer
    has counted this epoch (`fit_loop.epoch_loop.batch_progress.current.ready`, restored from the
    checkpoint; 0 at a fresh epoch) are skipped, only while fitting (DPO's precomputed reference at
    `on_fit_start` sees every row); the length stays the full epoch's, as Lightning expects. With
    workers, a loader built before the restore (e.g. by `estimated_stepping_batches` with
    `max_epochs`) restarts that epoch from its beginning.
    """

    def __init__(self, dataset, batch_size: int, *, num_replicas: int = 1, rank: int = 0, shuffle: bool = True,
                 seed: int = 0, trainer: Any = None):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.batch_size = batch_size
        self.trainer = trainer
        self.skipped_batches = 0  # batches skipped by the last iteration (for tests and logs)

    def batches_done(self) -> int:
        """Batches of the current epoch the trainer has already trained on (0 outside training)."""
        trainer = self.trainer
        if trainer is None or not getattr(trainer, "training", False) or getattr(trainer, "sanity_checking", False):
            return 0
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)

    def __iter__(self):
        indices = list(super().__iter__())
        done = self.batches_done()
        self.skipped_batches = done
        if done:
            log.info("resuming epoch %d of the train data after %d batch(es) (%d rows skipped)", self.epoch, done,
                     min(len(indices), done * self.batch_size))
        return iter(indices[done * self.batch_size:])
