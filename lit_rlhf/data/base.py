"""What every DataModule shares: finding and loading the source, validating and tokenising every
row once (with `datasets.map`, cached by `datasets`), bad-row policy, length statistics and the
data loaders.

A concrete DataModule supplies a *formatter*: a small picklable object that turns one raw row
into zero or more examples (dicts whose `_`-prefixed keys hold token ids and numbers, the other
keys metadata) or raises `BadRow`, and declares the feature types of what it returns.

Sources (`path`):
- `bundled:<name>`: a small dataset written by this project, shipped in `lit_rlhf/data/bundled/`
  (files `<name>.<split>.jsonl`; see `bundled_aliases()`);
- a local `.json`/`.jsonl`/`.parquet` file (it loads as split `train`; map it with
  `split_map`, e.g. `{"validation": "train"}`), or a dict of files per split in `data_files`;
- a directory written by `Dataset(Dict).save_to_disk` (read with `load_from_disk`), or a
  directory of data files (read with `load_dataset(dir)`);
- otherwise a Hugging Face hub id (needs network access or the hub cache).

A split name may carry a slice, as in `datasets`: `train[:1000]`, `train[98%:]`.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from lit_rlhf.data.formatting import BadRow

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
BUNDLED_PREFIX = "bundled:"
FORMAT_VERSION = "1"  # bump when a formatter's output changes, to invalidate `datasets` caches

BadRowPolicy = Literal["error", "skip"]
ROLES = ("train", "val", "test")
_BAD_COLUMNS = ("_bad_reason", "_bad_field", "_bad_detail")


class DataSourceError(RuntimeError):
    """A dataset source could not be found or loaded; the message says what to pass instead."""


class BadRowError(ValueError):
    """A bad row met with `on_bad_rows="error"`; names the source, split, row index and field."""

    def __init__(self, source: str, split: str, row: int, field: str, reason: str, detail: str, n_bad: int = 1):
        self.source, self.split, self.row, self.field, self.reason = source, split, row, field, reason
        more = f" ({n_bad - 1} more bad row(s) in this split)" if n_bad > 1 else ""
        super().__init__(
            f"bad row in {source} (split {split!r}, row {row}): field {field!r}: {detail} [{reason}]{more}. "
            "Fix the data, or set on_bad_rows='skip' to skip such rows (they are counted and logged by reason)."
        )


# --------------------------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------------------------


def bundled_aliases() -> dict[str, dict[str, str]]:
    """`{alias: {split: file}}` for every bundled file `<alias>.<split>.jsonl`."""
    out: dict[str, dict[str, str]] = {}
    for f in sorted(BUNDLED_DIR.glob("*.jsonl")):
        alias, _, split = f.stem.partition(".")
        if split:
            out.setdefault(alias, {})[split] = str(f)
    return out


_SLICE = re.compile(r"^(?P<name>[^\[\]]+?)\s*(\[\s*(?P<start>-?\d+%?)?\s*:\s*(?P<stop>-?\d+%?)?\s*\])?$")


def parse_split(spec: str) -> tuple[str, str | None, str | None]:
    """`"train[10:20%]"` -> `("train", "10", "20%")`; a plain name -> `(name, None, None)`."""
    m = _SLICE.match(spec.strip())
    if not m:
        raise ValueError(
            f"cannot parse split {spec!r}; expected a name, optionally sliced as 'train[:1000]' or 'train[98%:]'")
    return m["name"], m["start"], m["stop"]


def _bound(b: str | None, n: int) -> int | None:
    if b is None:
        return None
    if b.endswith("%"):
        return int(round(n * int(b[:-1]) / 100))
    return int(b)


def slice_range(n: int, start: str | None, stop: str | None) -> range:
    return range(n)[slice(_bound(start, n), _bound(stop, n))]


def _file_builder(files: list[str]) -> str:
    suffixes = {Path(f).suffix.lower() for f in files}
    if suffixes <= {".json", ".jsonl"}:
        return "json"
    if suffixes <= {".parquet"}:
        return "parquet"
    raise DataSourceError(f"unsupported data files {files}: expected .json, .jsonl or .parquet files")


def _is_saved_dataset_dir(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or Path(path).suffix.lower() in {".json", ".jsonl", ".parquet"}


class SourceLoader:
    """Loads named splits of one source and keeps local sources loaded once."""

    def __init__(self, path: str, name: str | None = None, data_files: dict[str, Any] | str | None = None,
                 split_map: dict[str, str] | None = None):
        self.path = path
        self.name = name
        self.data_files = data_files
        self.split_map = dict(split_map or {})
        self._local: Any = None  # DatasetDict (or Dataset) of a local source, loaded once

    def describe(self) -> str:
        hub = self.name and not self.path.startswith(BUNDLED_PREFIX) and not Path(self.path).expanduser().exists()
        return self.path + (f" (config {self.name!r})" if hub else "")

    def _kind(self) -> str:
        if self.path.startswith(BUNDLED_PREFIX):
            return "bundled"
        p = Path(self.path).expanduser()
        if p.is_file():
            return "file"
        if p.is_dir():
            return "disk" if _is_saved_dataset_dir(p) and self.data_files is None else "dir"
        if _looks_local(self.path):
            raise DataSourceError(f"dataset path {self.path!r} looks like a local path but does not exist")
        return "hub"

    def _load_local(self):
        import datasets

        if self._local is not None:
            return self._local
        kind = self._kind()
        if kind == "bundled":
            alias = self.path[len(BUNDLED_PREFIX):]
            table = bundled_aliases()
            if alias not in table:
                available = sorted(BUNDLED_PREFIX + a for a in table)
                raise DataSourceError(f"unknown bundled dataset {self.path!r}; available: {available}")
            self._local = datasets.load_dataset("json", data_files=table[alias])
        elif kind == "file":
            files = self.data_files if self.data_files is not None else {"train": str(Path(self.path).expanduser())}
            self._local = datasets.load_dataset(_file_builder(_flat_files(files)), data_files=files)
        elif kind == "disk":
            self._local = datasets.load_from_disk(str(Path(self.path).expanduser()))
        else:  # a directory of data files
            root = Path(self.path).expanduser()
            if self.data_files is not None:
                files = _resolve_files(self.data_files, root)
                self._local = datasets.load_dataset(_file_builder(_flat_files(files)), data_files=files)
            else:
                self._local = datasets.load_dataset(str(root))
        return self._local

    def load(self, spec: str):
        """The split named by `spec` (after `split_map`, then the optional slice), as a Dataset."""
        return self.load_with_offset(spec)[0]

    def load_with_offset(self, spec: str):
        """(Dataset, index in the full split of its first row)."""
        import datasets

        split, start, stop = parse_split(spec)
        split = self.split_map.get(split, split)
        if self._kind() == "hub":
            try:
                ds = datasets.load_dataset(self.path, self.name, split=split, data_files=self.data_files)
            except Exception as err:  # offline, unknown id, gated: all end here
                raise DataSourceError(
                    f"could not load split {split!r} of {self.describe()} from the Hugging Face hub "
                    f"({type(err).__name__}: {err}). On an offline machine, pass a local path instead: "
                    "`path: /data/file.jsonl` (a .json/.jsonl/.parquet file; it loads as split 'train', "
                    "use split_map to rename), a directory of such files, a directory written by "
                    "`save_to_disk`, or a bundled sample such as 'bundled:tldr_sft' "
                    f"(available: {sorted('bundled:' + a for a in bundled_aliases())})."
                ) from err
        else:
            loaded = self._load_local()
            if isinstance(loaded, datasets.Dataset):
                loaded = datasets.DatasetDict({"train": loaded})
            if split not in loaded:
                raise DataSourceError(
                    f"split {split!r} not found in {self.describe()}; it has {sorted(loaded)}. "
                    "Set the split names, or map them with split_map (e.g. {'validation': 'train'})."
                )
            ds = loaded[split]
        offset = 0
        if start is not None or stop is not None:
            rows = slice_range(len(ds), start, stop)
            ds = ds.select(rows)
            offset = rows.start
        return ds, offset


def _flat_files(files: dict[str, Any] | str | list) -> list[str]:
    if isinstance(files, str):
        return [files]
    if isinstance(files, dict):
        return [f for v in files.values() for f in ([v] if isinstance(v, str) else v)]
    return list(files)


def _resolve_files(files: dict[str, Any] | str, root: Path):
    def one(f: str) -> str:
        p = Path(f).expanduser()
        return str(p if p.is_absolute() else root / p)

    if isinstance(files, str):
        return one(files)
    return {k: (one(v) if isinstance(v, str) else [one(x) for x in v]) for k, v in files.items()}


# --------------------------------------------------------------------------------------------
# processing
# --------------------------------------------------------------------------------------------


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable hash of what a tokenizer does (vocab, merges, special tokens, chat template)."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        from datasets.fingerprint import Hasher

        h.update(Hasher.hash(tokenizer).encode())
    for part in (type(tokenizer).__name__, str(getattr(tokenizer, "chat_template", None)),
                 str(tokenizer.eos_token_id), str(tokenizer.pad_token_id), str(tokenizer.bos_token_id)):
        h.update(part.encode())
    return h.hexdigest()[:16]


class Formatter:
    """Turns one raw row into examples. Subclasses set `passthrough` (source columns copied to
    every example's metadata when present) and implement `features()` and `__call__`."""

    passthrough: tuple[str, ...] = ()

    def features(self) -> dict[str, Any]:
        """`{column: datasets feature}` of the computed columns `__call__` returns."""
        raise NotImplementedError

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Examples made from `row`; raise `BadRow` (or return examples made by `bad(...)`)."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """Everything besides the tokenizer that changes the output (for the cache fingerprint)."""
        return {k: v for k, v in vars(self).items() if k != "tokenizer"}

    @staticmethod
    def bad(err: BadRow) -> dict[str, Any]:
        return {"_bad_reason": err.reason, "_bad_field": err.field, "_bad_detail": err.detail}


class _MapFunction:
    """The batched `datasets.map` function around a formatter: runs it on every row, records
    `BadRow`s in the `_bad_*` columns, and copies the passthrough columns."""

    def __init__(self, formatter: Formatter, columns: list[str], passthrough: list[str], offset: int):
        self.formatter = formatter
        self.columns = columns
        self.passthrough = passthrough
        self.offset = offset  # index in the full split of the first row (for error messages)

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        out: dict[str, list] = {c: [] for c in self.columns}
        keys = list(batch)
        for j, idx in enumerate(indices):
            row = {k: batch[k][j] for k in keys}
            try:
                examples = self.formatter(row)
            except BadRow as err:
                examples = [Formatter.bad(err)]
            for ex in examples:
                for c in self.columns:
                    if c == "_row":
                        out[c].append(self.offset + idx)
                    elif c in _BAD_COLUMNS:
                        out[c].append(ex.get(c, ""))
                    elif c in self.passthrough and c not in ex:
                        out[c].append(row.get(c))
                    else:
                        out[c].append(ex.get(c))
        return out


def length_stats(lengths: list[int] | Any) -> dict[str, float]:
    """D4: count, min, mean, max and the 50/90/95/99th percentiles of token lengths."""
    t = torch.as_tensor(list(lengths), dtype=torch.float64)
    if t.numel() == 0:
        return {"count": 0}
    q = torch.quantile(t, torch.tensor([0.5, 0.9, 0.95, 0.99], dtype=torch.float64))
    return {"count": int(t.numel()), "min": float(t.min()), "mean": float(t.mean()), "max": float(t.max()),
            "p50": float(q[0]), "p90": float(q[1]), "p95": float(q[2]), "p99": float(q[3])}


# --------------------------------------------------------------------------------------------
# the DataModule base
# --------------------------------------------------------------------------------------------


class RLHFDataModule(L.LightningDataModule):
    """Shared plumbing; subclasses define `_formatter()`, `_collator(role)`, `length_columns`.

    Attributes after `setup`:
    - `datasets`: `{"train"|"val"|"test": processed datasets.Dataset}`;
    - `skipped_rows`: `Counter` of skipped rows by reason (all splits), and
      `skipped_rows_by_split`: `{split: Counter}`;
    - `length_stats`: `{split: {"prompt"|"completion"|...: {min, mean, max, p50, ...}}}` (D4).
    """

    default_path: ClassVar[str] = ""
    default_name: ClassVar[str | None] = None
    length_columns: ClassVar[dict[str, str]] = {"prompt": "_prompt_len"}

    def __init__(
        self,
        path: str,
        tokenizer: Any = None,
        *,
        name: str | None = None,
        train_split: str | None = "train",
        val_split: str | None = "validation",
        test_split: str | None = None,
        split_map: dict[str, str] | None = None,
        data_files: dict[str, Any] | str | None = None,
        max_prompt_length: int = 512,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        num_proc: int | None = None,
        seed: int = 0,
        on_bad_rows: BadRowPolicy = "error",
        limit: int | None = None,
    ):
        super().__init__()
        if on_bad_rows not in ("error", "skip"):
            raise ValueError(f"on_bad_rows must be 'error' or 'skip', got {on_bad_rows!r}")
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be positive, got {max_prompt_length}")
        self.path = path
        self.name = name
        self.splits = {"train": train_split, "val": val_split, "test": test_split}
        self.max_prompt_length = max_prompt_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.num_proc = num_proc
        self.seed = seed
        self.on_bad_rows = on_bad_rows
        self.limit = limit
        self.source = SourceLoader(path, name, data_files, split_map)
        self._tokenizer_arg = tokenizer
        self._tokenizer = None
        self.datasets: dict[str, Any] = {}
        self.skipped_rows: Counter = Counter()
        self.skipped_rows_by_split: dict[str, Counter] = {}
        self.length_stats: dict[str, dict[str, dict[str, float]]] = {}

    # -- tokenizer ----------------------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            tok = self._tokenizer_arg
            if tok is None:
                raise ValueError(f"{type(self).__name__} needs a tokenizer: a model name or a tokenizer object")
            if isinstance(tok, str):
                from lit_rlhf.models import load_tokenizer

                tok = load_tokenizer(tok, padding_side="right")
            if tok.eos_token_id is None:
                raise ValueError("the tokenizer has no EOS token; completions must end with one (D3)")
            if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
                raise ValueError(
                    "the tokenizer needs a PAD token distinct from EOS (D3): load it with "
                    "lit_rlhf.models.load_tokenizer, or call lit_rlhf.models.ensure_pad_token on it"
                )
            self._tokenizer = tok
        return self._tokenizer

    # -- what subclasses provide ----------------------------------------------------------------

    def _formatter(self, role: str) -> Formatter:
        raise NotImplementedError

    def _collator(self, role: str) -> Callable:
        raise NotImplementedError

    # -- preparation ----------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Download/load every configured split once (rank 0); processing happens in `setup`."""
        for role, spec in self.splits.items():
            if spec is not None:
                self.source.load(spec)

    def setup(self, stage: str | None = None) -> None:
        roles = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",)}.get(
            stage or "", ROLES)
        for role in roles:
            if self.splits.get(role) is not None:
                self.dataset(role)

    def dataset(self, role: str):
        """The processed dataset of a role ("train", "val" or "test"), built on first use."""
        role = "val" if role == "validation" else role
        if role not in ROLES:
            raise ValueError(f"unknown split role {role!r}; expected one of {ROLES}")
        if role not in self.datasets:
            spec = self.splits.get(role)
            if spec is None:
                raise ValueError(f"{type(self).__name__} has no {role} split configured")
            self.datasets[role] = self._build(role, spec)
        return self.datasets[role]

    def _build(self, role: str, spec: str):
        import datasets
        from datasets.fingerprint import Hasher

        raw, offset = self.source.load_with_offset(spec)
        if self.limit is not None:
            raw = raw.select(range(min(self.limit, len(raw))))

        formatter = self._formatter(role)
        computed = formatter.features()
        passthrough = [c for c in formatter.passthrough if c in raw.column_names and c not in computed]
        features = {c: raw.features[c] for c in passthrough}
        features.update(computed)
        features["_row"] = datasets.Value("int64")
        for c in _BAD_COLUMNS:
            features[c] = datasets.Value("string")
        columns = list(features)
        fingerprint = Hasher.hash([raw._fingerprint, tokenizer_fingerprint(self.tokenizer), formatter.config(),
                                   type(formatter).__name__, FORMAT_VERSION, offset])
        processed = raw.map(
            _MapFunction(formatter, columns, passthrough, offset),
            batched=True,
            with_indices=True,
            remove_columns=raw.column_names,
            features=datasets.Features(features),
            num_proc=self.num_proc if self.num_proc and self.num_proc > 1 else None,
            new_fingerprint=fingerprint,
            desc=f"formatting {role} ({spec})",
        )
        processed = self._apply_bad_row_policy(processed, role, spec)
        self._record_lengths(processed, role, spec)
        return processed

    def _apply_bad_row_policy(self, processed, role: str, spec: str):
        reasons = list(processed["_bad_reason"])
        bad = [i for i, r in enumerate(reasons) if r]
        counts = Counter(reasons[i] for i in bad)
        if bad and self.on_bad_rows == "error":
            i = bad[0]
            ex = processed[i]
            raise BadRowError(self.source.describe(), spec, ex["_row"], ex["_bad_field"], ex["_bad_reason"],
                              ex["_bad_detail"], n_bad=len(bad))
        self.skipped_rows_by_split[spec] = counts
        self.skipped_rows.update(counts)
        if bad:
            log.warning("%s split %r: skipped %d of %d examples: %s", self.source.describe(), spec, len(bad),
                        len(reasons), dict(counts))
            processed = processed.select([i for i, r in enumerate(reasons) if not r])
        return processed.remove_columns(list(_BAD_COLUMNS))

    def _record_lengths(self, processed, role: str, spec: str) -> None:
        stats = {k: length_stats(processed[c]) for k, c in self.length_columns.items() if c in processed.column_names}
        self.length_stats[role] = stats
        for k, s in stats.items():
            if s.get("count"):
                log.info("%s %s (%s) %s tokens: min %d, mean %.1f, p50 %.0f, p90 %.0f, p95 %.0f, p99 %.0f, max %d",
                         type(self).__name__, role, spec, k, s["min"], s["mean"], s["p50"], s["p90"], s["p95"],
                         s["p99"], s["max"])

    # -- loaders --------------------------------------------------------------------------------

    def _loader(self, role: str, shuffle: bool) -> DataLoader:
        ds = self.dataset(role)
        batch_size = self.batch_size if role == "train" else self.eval_batch_size
        trainer = getattr(self, "trainer", None)
        sampler = None
        if role == "train":
            sampler = ResumableSampler(
                ds, batch_size, num_replicas=max(1, getattr(trainer, "world_size", 1) if trainer else 1),
                rank=getattr(trainer, "global_rank", 0) if trainer else 0, shuffle=shuffle, seed=self.seed,
                trainer=trainer,
            )
        # the loader's own generator draws the per-iterator base seed, not the global generator,
        # so creating an iterator (again, on resume) leaves the global random state alone
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        return DataLoader(
            ds,
            batch_size=batch_size,
            sampler=sampler,
            shuffle=False if sampler is not None else shuffle,
            generator=generator,
            collate_fn=self._collator(role),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def batch_type(self, role: str = "train") -> type | None:
        """The batch class the `role` loader yields (`SFTBatch`, `PreferenceBatch`, ...), from its collator."""
        return getattr(type(self._collator(role)), "batch_type", None)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader("val", shuffle=False) if self.splits["val"] is not None else []

    def test_dataloader(self) -> DataLoader | list:
        return self._loader("test", shuffle=False) if self.splits["test"] is not None else []

    def predict_dataloader(self) -> DataLoader | list:
        return self.test_dataloader()


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
