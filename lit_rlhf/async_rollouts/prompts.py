"""Which prompts batch k holds, known before the fit loop gets there.

A producer that samples ahead of the learner needs the prompt batches the fit loop will hand the
learner later. The fit loop stays Lightning's and keeps iterating the train loader; the producer
computes the same batches itself from the loader's order, which must then be a function of
(seed, epoch): a sampler with `set_epoch` (`lit_rlhf.data.base.ResumableSampler`, torch's
`DistributedSampler`, what every `lit_rlhf` DataModule uses) or no shuffling. Batch k is batch
k mod n of epoch k // n, n = the batches per epoch the fit loop runs (`trainer.num_training_batches`).
The learner checks every batch it gets from the fit loop against the one that was sampled, so a
prompt is never lost or trained on twice unnoticed.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, SequentialSampler


class PromptSchedule:
    """Batch k of the fit, from the train loader's dataset, order and collate function.

    Args:
        loader: the fit's train DataLoader (map-style dataset, loaded in this process).
        batches_per_epoch: batches the fit loop takes from each epoch (`trainer.num_training_batches`).
    """

    def __init__(self, loader: DataLoader, batches_per_epoch: int) -> None:
        if not isinstance(loader, DataLoader):
            raise TypeError(f"asynchronous rollouts need a torch DataLoader as the train loader, got {type(loader).__name__}")
        batch_sampler = loader.batch_sampler
        if type(batch_sampler) is not BatchSampler:
            raise ValueError("asynchronous rollouts need the train loader's own batching (batch_size, no custom "
                             f"batch_sampler); got {type(batch_sampler).__name__}")
        sampler = batch_sampler.sampler
        if not (hasattr(sampler, "set_epoch") or isinstance(sampler, SequentialSampler)):
            raise ValueError(
                f"asynchronous rollouts sample prompt batches ahead of the fit loop, so the train order must be a "
                f"function of (seed, epoch): the train loader's sampler ({type(sampler).__name__}) has no set_epoch. "
                "Use a lit_rlhf DataModule (its ResumableSampler), a DistributedSampler, or shuffle=False")
        if not math.isfinite(batches_per_epoch) or batches_per_epoch < 1:
            raise ValueError(f"asynchronous rollouts need a finite number of batches per epoch, got {batches_per_epoch}")
        self.dataset, self.collate_fn = loader.dataset, loader.collate_fn
        self.batch_size, self.drop_last = batch_sampler.batch_size, batch_sampler.drop_last
        self.batches_per_epoch = int(batches_per_epoch)
        self._sampler = copy.copy(sampler)
        if hasattr(self._sampler, "trainer"):  # ResumableSampler: never skip (it reads the fit loop's counters)
            self._sampler.trainer = None
        self._epoch: int | None = None
        self._order: list[int] = []

    def indices(self, index: int) -> list[int]:
        """The dataset rows of batch `index` (0-based over the whole fit)."""
        epoch, position = divmod(index, self.batches_per_epoch)
        if epoch != self._epoch:
            if hasattr(self._sampler, "set_epoch"):
                self._sampler.set_epoch(epoch)
            self._order, self._epoch = list(iter(self._sampler)), epoch
        rows = self._order[position * self.batch_size: (position + 1) * self.batch_size]
        if not rows or (self.drop_last and len(rows) < self.batch_size):
            raise IndexError(f"batch {index} is batch {position} of epoch {epoch}, which has only "
                             f"{len(self._order) // self.batch_size} full batches")
        return rows

    def batch(self, index: int) -> Any:
        """Prompt batch `index`, collated as the train loader collates it."""
        return self.collate_fn([self.dataset[i] for i in self.indices(index)])
