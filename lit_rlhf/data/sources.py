"""Finding and loading a dataset source (`path`): `bundled:<name>` (`lit_rlhf/data/bundled/
<name>.<split>.jsonl`), a local .jsonl/.json/.parquet file (split `train`; rename with
`split_map`) or `data_files` per split, a directory of such files (splits named by the file
names, as `datasets` does), a `save_to_disk` directory, else a hub id. Local files are read by
`lit_rlhf.data.readers`; typed sources are checked column by column against the schema.

A split may carry a slice (`train[:1000]`, `train[98%:]`); unlike `datasets`, a slice is not
clipped: a bound beyond the rows, or an empty selection, is a `DataSourceError` naming them.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from lit_rlhf.data import schema as schemas
from lit_rlhf.data.errors import BadRowError, DataSourceError  # noqa: F401  (re-exported)
from lit_rlhf.data.readers import DATA_SUFFIXES, READ_COLUMNS, location_unit, read_split  # noqa: F401

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
BUNDLED_PREFIX = "bundled:"


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


def slice_problem(n: int, start: str | None, stop: str | None) -> str | None:
    """Why the slice `[start:stop]` of `n` rows is not usable (a bound beyond the rows or 100%, or
    no row selected), or None: clipped, `train[:1000]` / `train[1000:]` of 32 rows would silently
    give 32 validation rows and no training rows."""
    for name, b in (("start", start), ("stop", stop)):
        if b is None:
            continue
        value, pct = (int(b[:-1]), True) if b.endswith("%") else (int(b), False)
        if pct and abs(value) > 100:
            return f"the slice's {name} {b} is beyond 100%"
        if not pct and not -n <= value <= n:
            return f"the slice's {name} {b} is beyond them"
    if not slice_range(n, start, stop):
        return "the slice selects none of them"
    return None


def _resolve_files(files: dict[str, Any] | str, root: Path) -> dict[str, list[str]]:
    def one(f: str) -> str:
        p = Path(f).expanduser()
        return str(p if p.is_absolute() else root / p)

    if isinstance(files, (str, list)):
        files = {"train": files}
    return {k: [one(x) for x in ([v] if isinstance(v, str) else v)] for k, v in files.items()}


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
            saved = (p / "dataset_dict.json").is_file() or (p / "state.json").is_file()
            return "disk" if saved and self.data_files is None else "dir"
        if self.path.startswith((".", "/", "~")) or p.suffix.lower() in DATA_SUFFIXES:
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
            elif kind in ("file", "dir"):
                p = Path(self.path).expanduser()
                if self.data_files is not None:
                    self._files = _resolve_files(self.data_files, p.parent if kind == "file" else p)
                else:
                    self._files = {"train": [str(p)]} if kind == "file" else _directory_splits(p)
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
            files = self._has_split(self.split_files(), split)
            ds = read_split(files[split], self.spec or {}, split, self.on_bad_rows, self.schema_name)
        self._splits[split] = ds
        return ds

    def _has_split(self, splits: Any, split: str) -> Any:
        if split not in splits:
            raise DataSourceError(f"split {split!r} not found in {self.describe()}; it has {sorted(splits)}. Set the "
                                  "split names, or map them with split_map (e.g. {'validation': 'train'}).")
        return splits

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
        ds = self._has_split(self._typed, split)[split]
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
            problem = slice_problem(len(ds), start, stop)
            if problem:
                raise DataSourceError(self._slice_error(spec, split, len(ds), problem))
            rows = slice_range(len(ds), start, stop)
            ds = ds.select(rows)
            offset = rows.start
        return ds, offset

    def _slice_error(self, spec: str, split: str, n: int, problem: str) -> str:
        where = self.describe()
        files = self.split_files().get(split, []) if self.kind() in ("bundled", "file", "dir") else []
        if files and files != [str(Path(self.path).expanduser())]:
            where += f" ({', '.join(files)})"
        return (f"split {spec!r} of {where} is out of range: split {split!r} has {n} row(s), and {problem}. "
                f"Choose bounds within its {n} row(s), or percentages ('{split}[:90%]', '{split}[90%:]').")
