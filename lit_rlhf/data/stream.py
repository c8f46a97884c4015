"""A DataModule's train split as an endless stream of batches addressed by batch number: a
method's second data stream (PPO-ptx's SFT rows). Passes over the split are permutations drawn
from `seed + pass` (as `ResumableSampler`'s, D21), consecutive batches dealt to the ranks in turn:
the k-th batch depends on (k, rank, world size, seed, split size) only, so a saved batch counter
resumes on the same rows.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning import LightningDataModule


def stream_rows(num_rows: int, batch_size: int, index: int, seed: int = 0, rank: int = 0,
                world_size: int = 1) -> list[int]:
    """Row indices of the `index`-th batch (from 0) of `batch_size` rows on `rank` of `world_size`:
    positions [(index * world_size + rank) * batch_size, ... + batch_size) of the passes laid end
    to end (a batch may straddle two passes)."""
    if num_rows < 1 or batch_size < 1 or index < 0 or not 0 <= rank < world_size:
        raise ValueError(f"a stream needs rows, a batch size >= 1, an index >= 0 and 0 <= rank < world_size; "
                         f"got num_rows={num_rows}, batch_size={batch_size}, index={index}, rank={rank}, "
                         f"world_size={world_size}")
    start = (index * world_size + rank) * batch_size
    orders: dict[int, torch.Tensor] = {}
    rows = []
    for position in range(start, start + batch_size):
        n_pass, offset = divmod(position, num_rows)
        if n_pass not in orders:
            orders[n_pass] = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed + n_pass))
        rows.append(int(orders[n_pass][offset]))
    return rows


class BatchStream:
    """The train split of `datamodule` as a stream: `batch(index, rank, world_size)` collates the
    rows `stream_rows` names (the DataModule's `batch_size` and `seed`). The split is read on first
    use, or ahead of it by `prepare()`."""

    def __init__(self, datamodule: LightningDataModule, name: str = "stream") -> None:
        self.datamodule, self.name = datamodule, name
        self._loader = None

    @classmethod
    def from_spec(cls, spec: Any, tokenizer: Any, name: str) -> BatchStream:
        """The DataModule `spec` names, its arguments checked by jsonargparse as the CLI checks a
        config's `data:`, built with `tokenizer` (the module's: the spec must not name one).
        `name` is the setting that holds the spec, for the error messages."""
        from jsonargparse import ArgumentParser

        if not isinstance(spec, dict) or "class_path" not in spec:
            raise ValueError(f"{name} must be {{class_path, init_args}} of a DataModule (as a recipe's data: "
                             f"section), got {spec!r}")
        init_args = dict(spec.get("init_args") or {})
        if "tokenizer" in init_args:
            raise ValueError(f"{name}.init_args.tokenizer: the rows are tokenized with the policy's tokenizer; leave it out")
        parser = ArgumentParser(exit_on_error=False)
        parser.add_argument(f"--{name}", type=LightningDataModule)
        try:
            config = parser.parse_object({name: {**spec, "init_args": {**init_args, "tokenizer": tokenizer}}})
        except Exception as err:  # noqa: BLE001 - jsonargparse's message names the option
            raise ValueError(f"{name}: {err}") from None
        return cls(getattr(parser.instantiate(config), name), name)

    def prepare(self) -> None:
        """Read and format the split now (its errors at start-up rather than at the first batch)."""
        if self._loader is None:
            self._loader = self.datamodule.train_dataloader()  # only its dataset and collate function are used

    def batch(self, index: int, rank: int = 0, world_size: int = 1) -> Any:
        """The `index`-th batch of `rank`, collated by the DataModule's train collate function."""
        self.prepare()
        loader = self._loader
        seed = int(getattr(self.datamodule, "seed", 0) or 0)
        rows = stream_rows(len(loader.dataset), loader.batch_size, index, seed, rank, world_size)
        return loader.collate_fn([loader.dataset[i] for i in rows])
