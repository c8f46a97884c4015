"""The errors a data source raises: a source that cannot be loaded, and a bad row, named."""

from __future__ import annotations


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
