"""The DataModule base: sources (`lit_rlhf.data.sources`) in, every row validated and tokenised
once (`lit_rlhf.data.processing`, with `datasets.map`, cached by `datasets`), bad-row policy and
report, length statistics, and the data loaders (the train loader's order: `lit_rlhf.data.sampler`).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_rlhf.data import schema as schemas
from lit_rlhf.data.processing import (
    BAD_COLUMNS, TRUNCATED, Formatter, MapFunction, code_fingerprint, length_stats, tokenizer_fingerprint,
    write_bad_rows_report
)
from lit_rlhf.data.sampler import ResumableSampler
from lit_rlhf.data.signature import flat_init
from lit_rlhf.data.sources import BadRowError, SourceLoader, location_unit

log = logging.getLogger(__name__)

BadRowPolicy = Literal["error", "skip"]
MarginFrom = Literal["confidence", "score_difference"]
ROLES = ("train", "val", "test")
SHOWN_BAD_ROWS = 5  # skipped rows printed in the log (all of them are in the report)
BAD_ROWS_REPORT = "bad_rows.csv"


class RLHFDataModule(L.LightningDataModule):
    """The shared DataModule: rows read, checked against `raw_schema` (`lit_rlhf.data.schema`),
    tokenised once and batched. Subclasses define `_formatter(role)` and `_collator(role)`, take
    only their own arguments (keyword-only, `**kwargs` handed on) and set new defaults of inherited
    ones in `defaults`; each class gets one flat signature (`flat_init`; docs/guides/data.md).

    After `setup`: `datasets` (`{"train"|"val"|"test": datasets.Dataset}`), `skipped_rows` (a
    `Counter` by reason; `skipped_rows_by_split`), `bad_rows` (one record per skipped row, also in
    `bad_rows_report`, `bad_rows.csv` in the log directory), `truncated_completions` (`{role:
    count}`) and `length_stats` (`{role: {column: stats}}`, D4).

    Args:
        path: where the rows are: `bundled:<name>`, a local .json/.jsonl/.parquet file or
            directory, a `save_to_disk` directory, or a hub id (`lit_rlhf.data.sources`).
        tokenizer: a model name (loaded with `lit_rlhf.models.load_tokenizer`) or a tokenizer
            object with distinct PAD and EOS tokens (D3).
        name: the dataset's configuration name (hub datasets), e.g. `comparisons`.
        train_split: the split to train on, optionally sliced (`train[:98%]`); null: none.
        val_split: the split to validate on, optionally sliced; null: none.
        test_split: the split to test and predict on, optionally sliced; null: none.
        split_map: split names as this DataModule asks for them -> the source's names (a single
            local file loads as `train`: `{"validation": "train"}`).
        data_files: the files of each split (`{split: file or files}`), or one file.
        max_prompt_length: the longest prompt, in tokens (TL;DR posts are truncated to it, D2;
            longer chat and QA prompts are bad rows).
        batch_size: examples per training batch (per device).
        eval_batch_size: examples per validation / test batch; null: `batch_size`.
        num_workers: DataLoader worker processes (0: load in the main process).
        num_proc: processes for formatting and tokenising the rows once (`datasets.map`); null or
            1: the main process.
        seed: the train order's seed (a new permutation every epoch, D21) and the loaders'.
        on_bad_rows: `error` stops at the first row that does not fit the schema or the length
            caps (`BadRowError`, naming it); `skip` drops such rows, logs them and lists them all
            in `bad_rows.csv`.
        limit: keep only the first `limit` rows of each split (after its slice); null: all.
    """

    defaults: ClassVar[dict[str, Any]] = {}
    length_columns: ClassVar[dict[str, str]] = {k: f"_{k}_len" for k in ("prompt", "completion", "chosen", "rejected")}
    raw_schema: ClassVar[schemas.Schema | None] = None
    schema_name: ClassVar[str] = ""

    def __init__(self, path: str = "", tokenizer: Any = None, *, name: str | None = None,
                 train_split: str | None = "train", val_split: str | None = "validation", test_split: str | None = None,
                 split_map: dict[str, str] | None = None, data_files: dict[str, Any] | str | None = None,
                 max_prompt_length: int = 512, batch_size: int = 8, eval_batch_size: int | None = None,
                 num_workers: int = 0, num_proc: int | None = None, seed: int = 0, on_bad_rows: BadRowPolicy = "error",
                 limit: int | None = None):
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
        self.source = SourceLoader(path, name, data_files, split_map, spec=self.raw_schema, on_bad_rows=on_bad_rows,
                                   schema_name=self.schema_name)
        self._tokenizer_arg = tokenizer
        self._tokenizer = None
        self.datasets: dict[str, Any] = {}
        self.skipped_rows: Counter = Counter()
        self.skipped_rows_by_split: dict[str, Counter] = {}
        self.bad_rows: list[dict[str, Any]] = []
        self.truncated_completions: dict[str, int] = {}
        self.bad_rows_report: Path | None = None
        self.length_stats: dict[str, dict[str, dict[str, float]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__init__ = flat_init(cls, RLHFDataModule)

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

    def _formatter(self, role: str) -> Formatter:
        raise NotImplementedError

    def _collator(self, role: str) -> Callable:
        raise NotImplementedError

    def passthrough(self, role: str, consumed: tuple[str, ...]) -> tuple[str, ...]:
        """The source columns of `role` not consumed by formatting, kept as metadata."""
        return tuple(c for c in self.source.load(self.splits[role]).column_names if c not in consumed)

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
        self._write_report()

    def _write_report(self) -> None:
        """Skip mode: the skipped rows go to `bad_rows.csv` next to the run's logs (rank 0)."""
        trainer = getattr(self, "trainer", None)
        if not self.bad_rows or trainer is None or not getattr(trainer, "is_global_zero", True):
            return
        directory = trainer.log_dir or trainer.default_root_dir
        self.bad_rows_report = write_bad_rows_report(self.bad_rows, Path(directory) / BAD_ROWS_REPORT)
        log.warning("%d skipped row(s) listed in %s", len(self.bad_rows), self.bad_rows_report)

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
        passthrough = [c for c in formatter.passthrough
                       if c in raw.column_names and c not in computed and not c.startswith("_")]
        features = {**{c: raw.features[c] for c in passthrough}, **computed, "_row": datasets.Value("int64"),
                    **{c: datasets.Value("string") for c in BAD_COLUMNS}}
        columns = list(features)
        fingerprint = Hasher.hash([raw._fingerprint, tokenizer_fingerprint(self.tokenizer), formatter.config(),
                                   type(formatter).__name__, code_fingerprint(formatter), offset])
        processed = raw.map(MapFunction(formatter, columns, passthrough, offset), batched=True, with_indices=True,
                            remove_columns=raw.column_names, features=datasets.Features(features),
                            num_proc=self.num_proc if self.num_proc and self.num_proc > 1 else None,
                            new_fingerprint=fingerprint, desc=f"formatting {role} ({spec})")
        processed = self._apply_bad_row_policy(processed, raw, offset, role, spec)
        if TRUNCATED in processed.column_names:
            n = int(sum(processed[TRUNCATED]))
            self.truncated_completions[role] = n
            if n:
                log.warning("%s %s (%s): %d completion(s) longer than max_completion_length were truncated "
                            "(EOS kept last)", type(self).__name__, role, spec, n)
        self._record_lengths(processed, role, spec)
        return processed

    def _where(self, raw, indices: list[int]) -> list[dict[str, Any]]:
        """File and 1-based line/record of rows `indices` of `raw` (a local source), else the source."""
        if "_file" not in raw.column_names:
            return [{"file": self.source.describe(), "location": ""} for _ in indices]
        rows = raw.select(indices).select_columns(["_file", "_line"])
        return [{"file": f, "location": f"{location_unit(f)} {line}"} for f, line in zip(rows["_file"], rows["_line"])]

    def _apply_bad_row_policy(self, processed, raw, offset: int, role: str, spec: str):
        reasons = list(processed["_bad_reason"])
        bad = [i for i, r in enumerate(reasons) if r]
        counts = Counter(reasons[i] for i in bad)
        if bad and self.on_bad_rows == "error":
            ex = processed[bad[0]]
            [where] = self._where(raw, [ex["_row"] - offset])
            raise BadRowError(self.source.describe(), spec, ex["_row"], ex["_bad_field"], ex["_bad_reason"],
                              ex["_bad_detail"], n_bad=len(bad), file=where["file"], location=where["location"])
        self.skipped_rows_by_split[spec] = counts
        self.skipped_rows.update(counts)
        if bad:
            flagged = processed.select(bad).select_columns(["_row", *BAD_COLUMNS]).to_list()
            places = self._where(raw, [ex["_row"] - offset for ex in flagged])
            records = [{"split": spec, **where, "row": ex["_row"], "field": ex["_bad_field"],
                        "reason": ex["_bad_reason"], "detail": ex["_bad_detail"]} for ex, where in zip(flagged, places)]
            self.bad_rows.extend(records)
            log.warning("%s split %r: skipped %d of %d examples: %s", self.source.describe(), spec, len(bad),
                        len(reasons), dict(counts))
            for r in records[:SHOWN_BAD_ROWS]:
                log.warning("  skipped: %s %s (row %d): field %r: %s [%s]", r["file"], r["location"], r["row"],
                            r["field"], r["detail"], r["reason"])
            if len(records) > SHOWN_BAD_ROWS:
                log.warning("  ... and %d more (all listed in the bad-rows report)", len(records) - SHOWN_BAD_ROWS)
            processed = processed.select([i for i, r in enumerate(reasons) if not r])
        return processed.remove_columns(list(BAD_COLUMNS))

    def _record_lengths(self, processed, role: str, spec: str) -> None:
        stats = {k: length_stats(processed[c]) for k, c in self.length_columns.items() if c in processed.column_names}
        self.length_stats[role] = stats
        for k, s in stats.items():
            if s.get("count"):
                log.info("%s %s (%s) %s tokens: min %d, mean %.1f, p50 %.0f, p90 %.0f, p95 %.0f, p99 %.0f, max %d",
                         type(self).__name__, role, spec, k, s["min"], s["mean"], s["p50"], s["p90"], s["p95"],
                         s["p99"], s["max"])

    def _loader(self, role: str, shuffle: bool = True) -> DataLoader:
        """The loader of split `role`: the train split's through the resumable sampler (shuffled
        unless `shuffle` is False: a split read in order, as an evaluation reads it), the others in order."""
        ds, trainer = self.dataset(role), getattr(self, "trainer", None)
        batch_size = self.batch_size if role == "train" else self.eval_batch_size
        sampler = None
        if role == "train":
            sampler = ResumableSampler(ds, batch_size, num_replicas=max(1, getattr(trainer, "world_size", 1)),
                                       rank=getattr(trainer, "global_rank", 0), shuffle=shuffle, seed=self.seed,
                                       trainer=trainer)
        # the loader's own generator draws the per-iterator base seed, not the global generator,
        # so creating an iterator (again, on resume) leaves the global random state alone
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, generator=torch.Generator().manual_seed(self.seed),
                          collate_fn=self._collator(role), num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def batch_type(self, role: str = "train") -> type | None:
        """The batch class the `role` loader yields (`SFTBatch`, `PreferenceBatch`, ...), from its collator."""
        return getattr(type(self._collator(role)), "batch_type", None)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader | list:
        return self._loader("val") if self.splits["val"] is not None else []

    def test_dataloader(self) -> DataLoader | list:
        return self._loader("test") if self.splits["test"] is not None else []

    def predict_dataloader(self) -> DataLoader | list:
        return self.test_dataloader()
