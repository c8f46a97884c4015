"""Reading local data files row by row (not by `datasets`' JSON reader: no type is ever inferred
or changed), each row checked against the DataModule's schema (`lit_rlhf.data.schema`), reduced
to its declared fields (others dropped and logged) and written with its `datasets.Features` to an
arrow file cached by the files' identity, the schema and this code, then memory-mapped.

A row that cannot be read (not UTF-8, not JSON, not an object, a field of the wrong type) raises
`BadRowError` naming the file, the 1-based line (JSON Lines) or record (JSON array, parquet) and
the field with `on_bad_rows="error"`; with `"skip"` it becomes a placeholder row whose `_read_*`
columns say why. Missing and empty files are a `DataSourceError`. A `.json` array is parsed whole;
JSON Lines and parquet are streamed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator

from lit_rlhf.data import schema as schemas
from lit_rlhf.data.errors import BadRowError, DataSourceError

log = logging.getLogger(__name__)

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")

# reasons of bad rows found while reading (the formatters add their own, `formatting.py`)
NOT_UTF8 = "not UTF-8"
NOT_JSON = "not valid JSON"
NOT_OBJECT = "not a JSON object"
WRONG_TYPE = "malformed field"  # same reason as the formatters' BAD_STRUCTURE

READ_COLUMNS = ("_file", "_line", "_read_reason", "_read_field", "_read_detail")
"""Columns a local source adds to every raw row: where it comes from and why it could not be read."""

_BATCH = 1000


class _ReadError(Exception):
    def __init__(self, reason: str, field: str, detail: str):
        self.reason, self.field, self.detail = reason, field, detail


def _checked(obj: Any, spec: schemas.Schema, unknown: dict[str, str]) -> dict[str, Any] | _ReadError:
    if isinstance(obj, _ReadError):
        return obj
    if not isinstance(obj, dict):
        return _ReadError(NOT_OBJECT, "(row)", f"expected a JSON object, found {schemas.found(obj)}")
    try:
        return schemas.conform(obj, spec, "", unknown)  # undeclared keys dropped at every depth
    except schemas.TypeMismatch as err:
        return _ReadError(WRONG_TYPE, err.field, err.detail)


def iter_rows(path: str, spec: schemas.Schema, unknown: dict[str, str]) -> Iterator[tuple[int, Any]]:
    """(1-based line or record number, checked row dict or `_ReadError`) of every row of a file."""
    return ((number, _checked(obj, spec, unknown)) for number, obj in _raw_rows(path))


def _raw_rows(path: str) -> Iterator[tuple[int, Any]]:
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        yield from enumerate((obj for batch in _parquet(path).iter_batches(batch_size=_BATCH)
                              for obj in batch.to_pylist()), start=1)
        return
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    if suffix == ".json" and head.startswith(b"["):
        yield from enumerate(_json_array(path), start=1)
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue  # a blank line is not a row
            try:
                yield number, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                yield number, _ReadError(NOT_UTF8, "(line)", f"byte 0x{raw[err.start]:02x} at column {err.start + 1} "
                                                             "is not UTF-8")
            except json.JSONDecodeError as err:
                yield number, _ReadError(NOT_JSON, "(line)", f"{err.msg} at column {err.colno}")


def _json_array(path: str) -> list:
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataSourceError(f"{path}, line {line}: byte 0x{data[err.start]:02x} is not UTF-8 "
                              "(a JSON array file is read as a whole: fix the byte, or write JSON Lines)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataSourceError(f"{path}, line {err.lineno} column {err.colno}: not valid JSON: {err.msg} "
                              "(a JSON array file is read as a whole: fix it, or write JSON Lines)") from None


def _parquet(path: str):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as err:  # not parquet bytes, truncated file, ...
        raise DataSourceError(f"{path} cannot be read as parquet ({type(err).__name__}: {err})") from None


@functools.lru_cache(maxsize=256)
def location_unit(path: str) -> str:
    """"line" (JSON Lines) or "record" (JSON array, parquet): how a row of `path` is located."""
    p = Path(path)
    if p.suffix.lower() == ".parquet":
        return "record"
    if p.suffix.lower() == ".json":
        with open(p, "rb") as f:
            if f.read(4096).lstrip().startswith(b"["):
                return "record"
    return "line"


def read_split(files: list[str], spec: schemas.Schema, split: str, on_bad_rows: str, schema_name: str = ""):
    """The rows of `files` as one memory-mapped `datasets.Dataset` with the schema's features plus
    `READ_COLUMNS`; see the module docstring. Cached by the files' identity and this code."""
    import datasets

    for f in files:
        p = Path(f)
        if not p.exists():
            raise DataSourceError(f"data file {f} does not exist")
        if not p.is_file():
            raise DataSourceError(f"data file {f} is not a file")
        if p.suffix.lower() not in DATA_SUFFIXES:
            raise DataSourceError(f"unsupported data file {f}: expected a .jsonl, .json or .parquet file")
    ident = [(str(Path(f).resolve()), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    code = hashlib.sha256(b"".join(Path(m).read_bytes() for m in (__file__, schemas.__file__))).hexdigest()
    key = hashlib.sha256(json.dumps([ident, repr(spec), code]).encode()).hexdigest()[:24]
    cache = Path(datasets.config.HF_DATASETS_CACHE) / "lit_rlhf_raw"
    arrow, meta_path = cache / f"{key}.arrow", cache / f"{key}.json"
    if arrow.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
    else:
        meta = _write_split(files, spec, split, on_bad_rows, arrow, meta_path)
    if meta["first_error"] and on_bad_rows == "error":
        e = meta["first_error"]
        raise BadRowError(files[0], split, e["row"], e["field"], e["reason"], e["detail"], meta["n_bad"], e["file"],
                          e["location"])
    if meta["unknown"]:
        shown = ", ".join(f"{k} (first at {v})" for k, v in list(meta["unknown"].items())[:8])
        log.warning("split %r of %s: fields not in the %s schema are not read: %s", split, ", ".join(files),
                    schema_name or "DataModule's", shown)
    ds = datasets.Dataset.from_file(str(arrow))
    absent = [c for c in spec if c not in meta["present"]]
    return ds.remove_columns(absent) if absent else ds


def _write_split(files, spec, split, on_bad_rows, arrow: Path, meta_path: Path) -> dict[str, Any]:
    import datasets
    from datasets.arrow_writer import ArrowWriter

    feats = schemas.features(spec)
    feats.update({c: datasets.Value("int64" if c == "_line" else "string") for c in READ_COLUMNS})
    columns = list(feats)
    arrow.parent.mkdir(parents=True, exist_ok=True)
    tmp = arrow.with_name(f"{arrow.name}.{os.getpid()}.tmp")
    unknown: dict[str, str] = {}
    present: set[str] = set()
    n_rows, n_bad, first_error = 0, 0, None
    writer = ArrowWriter(features=feats, path=str(tmp))
    try:
        batch: dict[str, list] = {c: [] for c in columns}
        for f in files:
            unit = location_unit(f)
            file_unknown: dict[str, str] = {}
            named: set[str] = set()
            for number, row in iter_rows(f, spec, file_unknown):
                location = f"{unit} {number}"
                if isinstance(row, _ReadError):
                    n_bad += 1
                    if first_error is None:
                        first_error = {"row": n_rows, "field": row.field, "reason": row.reason, "detail": row.detail,
                                       "file": f, "location": location}
                    if on_bad_rows == "error":
                        raise BadRowError(f, split, n_rows, row.field, row.reason, row.detail, 1, f, location)
                    values, why = {}, (row.reason, row.field, row.detail)
                else:
                    present.update(row)
                    values, why = row, (None, None, None)
                for c in spec:
                    batch[c].append(values.get(c))
                for c, v in zip(READ_COLUMNS, (f, number, *why)):
                    batch[c].append(v)
                n_rows += 1
                if len(file_unknown) > len(named):  # an undeclared key first met on this row
                    for k in list(file_unknown)[len(named):]:
                        named.add(k)
                        unknown.setdefault(k, f"{f}, {location}, field {file_unknown[k]}")
                if len(batch["_line"]) >= _BATCH:
                    writer.write_batch(batch)
                    batch = {c: [] for c in columns}
        if batch["_line"]:
            writer.write_batch(batch)
        writer.finalize()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    if n_rows == 0:
        tmp.unlink(missing_ok=True)
        raise DataSourceError(f"split {split!r} has no rows: {', '.join(files)} "
                              f"{'is' if len(files) == 1 else 'are'} empty")
    meta = {"rows": n_rows, "n_bad": n_bad, "first_error": first_error, "unknown": unknown,
            "present": sorted(present)}
    os.replace(tmp, arrow)
    meta_tmp = meta_path.with_name(f"{meta_path.name}.{os.getpid()}.tmp")
    meta_tmp.write_text(json.dumps(meta))
    os.replace(meta_tmp, meta_path)
    return meta
