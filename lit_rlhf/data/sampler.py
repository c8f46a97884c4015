"""The train loader's sampler: a new permutation every epoch, this rank's share of it, and an exact
mid-epoch resume (`ResumableSampler`)."""

from __future__ import annotations

import logging
from typing import Any

from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)


class ResumableSampler(DistributedSampler):
    """The train order: a permutation of the rows drawn from (seed, epoch), a new one every epoch
    (D21's reshuffle), this rank's share of it, and, on a resumed run, without the batches of the
    current epoch that were already trained on.

    - Deterministic: `torch.Generator().manual_seed(seed + epoch)` (DistributedSampler's recipe);
      it never touches the global generator. Lightning sets the epoch (`set_epoch`) before each
      epoch's first batch, also after a resume. Being a `DistributedSampler`, Lightning keeps it
      under DDP/DeepSpeed (it does not inject its own); rank r takes rows r, r+W, ... of the
      permutation (padded by wrap-around to a multiple of W, like DistributedSampler).
    - Exact mid-epoch resume: when an epoch's iteration starts, the batches of that epoch the
      trainer has already counted (`fit_loop.epoch_loop.batch_progress.current.ready`, restored
      from the checkpoint before the first batch is fetched, and 0 at a fresh epoch) are skipped,
      `skip * batch_size` rows of this rank's share. The length stays the full epoch's, which is
      what Lightning's counters expect. Iteration starts at the first `next()` (the DataLoader's
      BatchSampler is lazy), so with `num_workers=0` the counters are always read after the
      restore; with workers the loader prefetches when it is created, which is after the restore
      unless the loader was built earlier (e.g. by `estimated_stepping_batches` with
      `max_epochs` set), in which case the first epoch after the resume starts from its beginning.
    - The skip applies only while the trainer is fitting, so the same loader iterated by other
      code outside the training loop (e.g. DPO's precomputed reference at `on_fit_start`) sees
      every row.
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
