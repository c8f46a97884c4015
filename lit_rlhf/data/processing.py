"""Raw rows -> tokenised examples with `datasets.map` (a DataModule's `Formatter`), the cache key
of that work (raw split, tokenizer, formatter options and source code: an edited formatter never
serves stale rows), and the records of bad rows."""

from __future__ import annotations

import csv
import hashlib
import inspect
import sys
from pathlib import Path
from typing import Any

import datasets
import torch

from lit_rlhf.data.formatting import BadRow, encode_completion, fit_completion

BAD_COLUMNS = ("_bad_reason", "_bad_field", "_bad_detail")
TRUNCATED = "_truncated"  # completions of the example cut to the length cap (counted and logged)
CNNDM = "_cnndm"  # a CNN/DM row of the TL;DR comparisons
IDS, STR, INT = datasets.Sequence(datasets.Value("int32")), datasets.Value("string"), datasets.Value("int32")


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


def code_fingerprint(formatter: Any) -> str:
    """A hash of the source files that shape the formatter's examples: the modules of its class
    and of every base class, `formatting.py` and this module."""
    files = {Path(__file__).resolve(), Path(sys.modules[BadRow.__module__].__file__).resolve()}
    for cls in type(formatter).__mro__:
        if cls is object:
            continue
        try:
            files.add(Path(inspect.getfile(cls)).resolve())
        except (TypeError, OSError):  # a class defined interactively: hash its attributes instead
            files.add(Path(repr(sorted(vars(cls)))))
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.name).encode())
        h.update(f.read_bytes() if f.is_file() else str(f).encode())
    return h.hexdigest()[:16]


class Formatter:
    """Turns one raw row into examples (dicts: `_`-prefixed keys hold token ids and numbers, the
    others metadata) or raises `BadRow`; small and picklable. Subclasses set `passthrough` (source
    columns copied to every example's metadata when present) and implement `features()` and
    `__call__`. Built from its DataModule: the tokenizer, the DataModule settings named in
    `options`, and `extra` (all of them, but the tokenizer, are its `config()`)."""

    passthrough: tuple[str, ...] = ()
    options: tuple[str, ...] = ()

    def __init__(self, dm: Any = None, **extra: Any):
        self.tokenizer = getattr(dm, "tokenizer", None)
        for name in self.options:
            setattr(self, name, getattr(dm, name))
        vars(self).update(extra)

    def features(self) -> dict[str, Any]:
        """`{column: datasets feature}` of the computed columns `__call__` returns."""
        raise NotImplementedError

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Examples made from `row`; raise `BadRow` (or return examples made by `bad(...)`)."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """Everything besides the tokenizer that changes the output (for the cache fingerprint)."""
        return {k: v for k, v in vars(self).items() if k != "tokenizer"}

    def completion_ids(self, text: str, field: str, max_length: int | None = None) -> tuple[list[int], int]:
        """D3 ids of a completion (EOS last) capped at `max_length` (default `max_completion_length`),
        and 1 if they were cut (`truncate_completions`) else 0."""
        full = encode_completion(self.tokenizer, text)
        ids = fit_completion(full, max_length or self.max_completion_length, self.tokenizer.eos_token_id,
                             truncate=self.truncate_completions, field=field)
        return ids, int(len(full) > len(ids))

    @staticmethod
    def bad(err: BadRow) -> dict[str, Any]:
        return {"_bad_reason": err.reason, "_bad_field": err.field, "_bad_detail": err.detail}


class MapFunction:
    """The batched `datasets.map` function around a formatter: runs it on every row, records
    `BadRow`s (and rows the source could not read) in the `_bad_*` columns, and copies the
    passthrough columns."""

    def __init__(self, formatter: Formatter, columns: list[str], passthrough: list[str], offset: int):
        self.formatter = formatter
        self.columns = columns
        self.passthrough = passthrough
        self.offset = offset  # index in the full split of the first row (for error messages)

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        out: dict[str, list] = {c: [] for c in self.columns}
        keys = list(batch)
        unread = batch.get("_read_reason")
        for j, idx in enumerate(indices):
            if unread is not None and unread[j]:
                examples = [{"_bad_reason": unread[j], "_bad_field": batch["_read_field"][j],
                             "_bad_detail": batch["_read_detail"][j]}]
                row: dict[str, Any] = {}
            else:
                row = {k: batch[k][j] for k in keys}
                try:
                    examples = self.formatter(row)
                except BadRow as err:
                    examples = [Formatter.bad(err)]
            for ex in examples:
                ex = {**{c: row.get(c) for c in self.passthrough}, **{c: "" for c in BAD_COLUMNS}, **ex,
                      "_row": self.offset + idx}
                for c in self.columns:
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


REPORT_FIELDS = ("split", "file", "location", "row", "field", "reason", "detail")


def write_bad_rows_report(records: list[dict[str, Any]], path: str | Path) -> Path:
    """One CSV line per skipped row (or per skipped completion of a multi-completion row):
    split, file, location ("line N" / "record N", 1-based; empty for hub sources), row (index in
    the split), field, reason, detail."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=REPORT_FIELDS)
        writer.writeheader()
        for r in records:
            writer.writerow({k: r.get(k, "") for k in REPORT_FIELDS})
    return path
