"""Finding and reading a dataset source, and naming every bad row in it.

Sources (`path`):
- `bundled:<name>`: a small dataset written by this project, shipped in `lit_rlhf/data/bundled/`
  (files `<name>.<split>.jsonl`; see `bundled_aliases()`);
- a local `.jsonl` / `.json` (JSON Lines, or one JSON array of objects) / `.parquet` file (it loads
  as split `train`; map it with `split_map`, e.g. `{"validation": "train"}`), or a dict of files
  per split in `data_files`;
- a directory of such files (splits named by the file names, as `datasets` does: `train.jsonl`,
  `validation.jsonl`, `data/test_prefs-00000-of-00001.parquet`, ...);
- a directory written by `Dataset(Dict).save_to_disk`;
- otherwise a Hugging Face hub id (needs network access or the hub cache).

A split name may carry a slice, as in `datasets`: `train[:1000]`, `train[98%:]`.

Local files are read here, not by `datasets`' JSON reader, so no type is ever inferred or changed:
every line (JSON Lines) or record (JSON arrays, parquet) is parsed and checked against the
DataModule's published schema (`lit_rlhf.data.schema`) as it is in the file, then written to an
arrow file with that schema's `datasets.Features` and memory-mapped (`datasets.Dataset`), cached
by the files' identity (path, size, modification time) and this reader's code. A row that cannot be
read (bytes that are not UTF-8, a line that is not JSON, a field of the wrong type) is a bad row
named by file, line (or record, both 1-based), field and what was expected vs found: an error
(`BadRowError`) by default, or, with `on_bad_rows="skip"`, a placeholder row that the DataModule
counts and reports. Missing files, empty files and directories without data files are a
`DataSourceError`. Typed sources (hub, `save_to_disk`) are checked column by column.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator

from lit_rlhf.data import schema as schemas

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
BUNDLED_PREFIX = "bundled:"
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")

# reasons of bad rows found while reading (the formatters add their own, `formatting.py`)
NOT_UTF8 = "not UTF-8"
NOT_JSON = "not valid JSON"
NOT_OBJECT = "not a JSON object"
WRONG_TYPE = "malformed field"  # same reason as the formatters' BAD_STRUCTURE

READ_COLUMNS = ("_file", "_line", "_read_reason", "_read_field", "_read_detail")
"""Columns a local source adds to every raw row: where it comes from and why it could not be read."""

_BATCH = 1000


class DataSourceError(RuntimeError):
    """A dataset source could not be found or loaded; the message says what to pass instead."""


class BadRowError(ValueError):
    """A bad row met with `on_bad_rows="error"`: names the file and line (or record) when the
    source is a local file, the split, the row index in the split, the field, and what is wrong."""

    def __init__(self, source: str, split: str, row: int, field: str, reason: str, detail: str, n_bad: int = 1,
                 file: str | None = None, location: str | None = None):
        self.source, self.split, self.row, self.field, self.reason, self.detail = source, split, row, field, reason, detail
        self.file, self.location = file, location
        where = f"{file}, {location}" if file and location else source
        more = f" ({n_bad - 1} more bad row(s) in this split)" if n_bad > 1 else ""
        super().__init__(
            f"bad row in {where} (split {split!r}, row {row}): field {field!r}: {detail} [{reason}]{more}. "
            "Fix the data, or set on_bad_rows='skip' to skip such rows (they are counted, logged and "
            "listed in a bad-rows report)."
        )


# --------------------------------------------------------------------------------------------
# names
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


# --------------------------------------------------------------------------------------------
# reading one file, row by row
# --------------------------------------------------------------------------------------------


class _ReadError(Exception):
    def __init__(self, reason: str, field: str, detail: str):
        self.reason, self.field, self.detail = reason, field, detail


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _checked(obj: Any, spec: schemas.Schema, unknown: dict[str, str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _ReadError(NOT_OBJECT, "(row)", f"expected a JSON object, found {schemas.found(obj)}")
    try:
        schemas.check(obj, spec, "", unknown)
    except schemas.TypeMismatch as err:
        raise _ReadError(WRONG_TYPE, err.field, err.detail) from None
    return obj


def iter_rows(path: str, spec: schemas.Schema, unknown: dict[str, str]) -> Iterator[tuple[int, Any]]:
    """(1-based line or record number, checked row dict or `_ReadError`) of every row of a file."""
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        yield from _iter_parquet(path, spec, unknown)
        return
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    if suffix == ".json" and head.startswith(b"["):
        yield from _iter_json_array(path, spec, unknown)
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue  # a blank line is not a row
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield number, _ReadError(NOT_UTF8, "(line)", f"byte 0x{raw[err.start]:02x} at column {err.start + 1} "
                                                             "is not UTF-8")
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as err:
                yield number, _ReadError(NOT_JSON, "(line)", f"{err.msg} at column {err.colno}")
                continue
            try:
                yield number, _checked(obj, spec, unknown)
            except _ReadError as err:
                yield number, err


def _iter_json_array(path: str, spec, unknown):
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataSourceError(f"{path}, line {_line_of(data, err.start)}: byte 0x{data[err.start]:02x} is not UTF-8 "
                              "(a JSON array file is read as a whole: fix the byte, or write JSON Lines)") from None
    try:
        records = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataSourceError(f"{path}, line {err.lineno} column {err.colno}: not valid JSON: {err.msg} "
                              "(a JSON array file is read as a whole: fix it, or write JSON Lines)") from None
    for number, obj in enumerate(records, start=1):
        try:
            yield number, _checked(obj, spec, unknown)
        except _ReadError as err:
            yield number, err


def _iter_parquet(path: str, spec, unknown):
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # not parquet bytes, truncated file, ...
        raise DataSourceError(f"{path} cannot be read as parquet ({type(err).__name__}: {err})") from None
    number = 0
    for batch in pf.iter_batches(batch_size=_BATCH):
        for obj in batch.to_pylist():
            number += 1
            try:
                yield number, _checked(obj, spec, unknown)
            except _ReadError as err:
                yield number, err


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


# --------------------------------------------------------------------------------------------
# reading one split (a list of files) into a cached, memory-mapped arrow dataset
# --------------------------------------------------------------------------------------------


def _code_hash() -> str:
    h = hashlib.sha256()
    for module in (__file__, schemas.__file__):
        h.update(Path(module).read_bytes())
    return h.hexdigest()


def _cache_dir() -> Path:
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "lit_rlhf_raw"


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
    key = hashlib.sha256(json.dumps([ident, repr(spec), _code_hash()]).encode()).hexdigest()[:24]
    cache = _cache_dir()
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
    feats.update({"_file": datasets.Value("string"), "_line": datasets.Value("int64"),
                  "_read_reason": datasets.Value("string"), "_read_field": datasets.Value("string"),
                  "_read_detail": datasets.Value("string")})
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
            for number, row in iter_rows(f, spec, file_unknown):
                location = f"{unit} {number}"
                if isinstance(row, _ReadError):
                    n_bad += 1
                    if first_error is None:
                        first_error = {"row": n_rows, "field": row.field, "reason": row.reason, "detail": row.detail,
                                       "file": f, "location": location}
                    if on_bad_rows == "error":
                        raise BadRowError(f, split, n_rows, row.field, row.reason, row.detail, 1, f, location)
                    for c in spec:
                        batch[c].append(None)
                    reason, field, detail = row.reason, row.field, row.detail
                else:
                    present.update(row)
                    for c in spec:
                        batch[c].append(row.get(c))
                    reason = field = detail = None
                batch["_file"].append(f)
                batch["_line"].append(number)
                batch["_read_reason"].append(reason)
                batch["_read_field"].append(field)
                batch["_read_detail"].append(detail)
                n_rows += 1
                if len(batch["_line"]) >= _BATCH:
                    writer.write_batch(batch)
                    batch = {c: [] for c in columns}
            for k, v in file_unknown.items():
                unknown.setdefault(k, f"{f}, {unit} of field {v}")
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


# --------------------------------------------------------------------------------------------
# the source of a DataModule
# --------------------------------------------------------------------------------------------


def _is_saved_dataset_dir(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or Path(path).suffix.lower() in DATA_SUFFIXES


def _as_list(v) -> list[str]:
    return [v] if isinstance(v, str) else list(v)


def _resolve_files(files: dict[str, Any] | str, root: Path) -> dict[str, list[str]]:
    def one(f: str) -> str:
        p = Path(f).expanduser()
        return str(p if p.is_absolute() else root / p)

    if isinstance(files, (str, list)):
        files = {"train": files}
    return {k: [one(x) for x in _as_list(v)] for k, v in files.items()}


def _directory_splits(root: Path) -> dict[str, list[str]]:
    """Split name -> data files of a directory, by `datasets`' file-name conventions."""
    from datasets.data_files import DataFilesDict, get_data_patterns
    from datasets.exceptions import DataFilesNotFoundError

    def no_data(why: str) -> DataSourceError:
        listing = sorted(p.name for p in root.iterdir())[:10]
        return DataSourceError(f"directory {root} has no data files (.jsonl, .json or .parquet); it holds {listing} "
                               f"({why})")

    try:
        patterns = get_data_patterns(str(root))
        found = DataFilesDict.from_patterns(patterns, str(root))
    except (DataFilesNotFoundError, FileNotFoundError, ValueError) as err:
        raise no_data(type(err).__name__) from None
    out, ignored = {}, []
    for split, fs in found.items():
        keep = [str(f) for f in fs if Path(str(f)).suffix.lower() in DATA_SUFFIXES]
        ignored += [str(f) for f in fs if Path(str(f)).suffix.lower() not in DATA_SUFFIXES]
        if keep:
            out[split] = keep
    if not out:
        raise no_data("no file with a data suffix")
    if ignored:
        log.warning("%s: not data files, not read: %s", root, ignored[:5])
    return out


class SourceLoader:
    """Loads named splits of one source (each split read once) and checks them against `spec`."""

    def __init__(self, path: str, name: str | None = None, data_files: dict[str, Any] | str | None = None,
                 split_map: dict[str, str] | None = None, spec: schemas.Schema | None = None,
                 on_bad_rows: str = "error", schema_name: str = ""):
        self.path = path
        self.name = name
        self.data_files = data_files
        self.split_map = dict(split_map or {})
        self.spec = spec
        self.on_bad_rows = on_bad_rows
        self.schema_name = schema_name
        self._splits: dict[str, Any] = {}
        self._files: dict[str, list[str]] | None = None
        self._typed: Any = None  # a save_to_disk DatasetDict

    def describe(self) -> str:
        hub = self.name and not self.path.startswith(BUNDLED_PREFIX) and not Path(self.path).expanduser().exists()
        return self.path + (f" (config {self.name!r})" if hub else "")

    def kind(self) -> str:
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

    def split_files(self) -> dict[str, list[str]]:
        """Split name -> local data files (bundled, file and directory sources)."""
        if self._files is None:
            kind = self.kind()
            if kind == "bundled":
                alias = self.path[len(BUNDLED_PREFIX):]
                table = bundled_aliases()
                if alias not in table:
                    available = sorted(BUNDLED_PREFIX + a for a in table)
                    raise DataSourceError(f"unknown bundled dataset {self.path!r}; available: {available}")
                self._files = {k: [v] for k, v in table[alias].items()}
            elif kind == "file":
                p = Path(self.path).expanduser()
                self._files = (_resolve_files(self.data_files, p.parent) if self.data_files is not None
                               else {"train": [str(p)]})
            elif kind == "dir":
                root = Path(self.path).expanduser()
                self._files = (_resolve_files(self.data_files, root) if self.data_files is not None
                               else _directory_splits(root))
            else:
                raise DataSourceError(f"{self.describe()} is not a local source of data files")
        return self._files

    def load(self, spec: str):
        """The split named by `spec` (after `split_map`, then the optional slice), as a Dataset."""
        return self.load_with_offset(spec)[0]

    def _load_split(self, split: str):
        if split in self._splits:
            return self._splits[split]
        kind = self.kind()
        if kind == "hub":
            ds = self._load_hub(split)
        elif kind == "disk":
            ds = self._load_disk(split)
        else:
            files = self.split_files()
            if split not in files:
                raise DataSourceError(
                    f"split {split!r} not found in {self.describe()}; it has {sorted(files)}. "
                    "Set the split names, or map them with split_map (e.g. {'validation': 'train'})."
                )
            ds = read_split(files[split], self.spec or {}, split, self.on_bad_rows, self.schema_name)
        self._splits[split] = ds
        return ds

    def _check_typed(self, ds, split: str) -> None:
        if self.spec is None:
            return
        bad = schemas.check_features(ds.features, self.spec)
        if bad:
            cols = "; ".join(f"column {c!r}: expected {want}, found {have}" for c, want, have in bad)
            raise DataSourceError(f"split {split!r} of {self.describe()} does not have the {self.schema_name or ''} "
                                  f"schema's types: {cols}")

    def _load_disk(self, split: str):
        import datasets

        if self._typed is None:
            loaded = datasets.load_from_disk(str(Path(self.path).expanduser()))
            self._typed = datasets.DatasetDict({"train": loaded}) if isinstance(loaded, datasets.Dataset) else loaded
        if split not in self._typed:
            raise DataSourceError(
                f"split {split!r} not found in {self.describe()}; it has {sorted(self._typed)}. "
                "Set the split names, or map them with split_map (e.g. {'validation': 'train'})."
            )
        ds = self._typed[split]
        self._check_typed(ds, split)
        return ds

    def _load_hub(self, split: str):
        import datasets

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
        self._check_typed(ds, split)
        return ds

    def load_with_offset(self, spec: str):
        """(Dataset, index in the full split of its first row)."""
        split, start, stop = parse_split(spec)
        split = self.split_map.get(split, split)
        ds = self._load_split(split)
        offset = 0
        if start is not None or stop is not None:
            rows = slice_range(len(ds), start, stop)
            ds = ds.select(rows)
            offset = rows.start
        return ds, offset
