"""Corrupt inputs, for the TL;DR comparisons and both UltraFeedback schemas: every bad byte, line
and field named (file, 1-based line or record, field, expected vs found) in error mode; counted,
logged and reported row by row in skip mode; nothing coerced."""

from __future__ import annotations

import csv
import json
import logging

import pytest

from lit_rlhf.data import (
    BadRowError,
    DataSourceError,
    TLDRPreferenceDataModule,
    TLDRSFTDataModule,
    UltraFeedbackPreferenceDataModule,
    UltraFeedbackSingleDataModule,
)
from tests.data.conftest import binarized_row, openbmb_row, tldr_sft_row, write_jsonl, write_parquet

N = 5
BAD = 2  # 0-based index of the broken row: line 3 of a JSONL file


def comparison_row(k: int) -> dict:
    return {
        "info": {"id": f"t3_{k}", "post": f"Post {k}.\n\nMore {k}.", "title": f"Title {k}", "subreddit": "test"},
        "split": "train",
        "summaries": [{"text": f" Good summary {k}.", "policy": "a", "note": ""},
                      {"text": f" Bad summary {k}.", "policy": "b", "note": ""}],
        "choice": k % 2, "worker": "w", "batch": "batch1", "extra": {"confidence": 5},
    }


def _openbmb(k: int) -> dict:
    return openbmb_row(k, [5.0, 6.0, 7.0])


# schema -> (DataModule class, row builder, examples per row, (field, mutation) of a wrong-typed value)
SCHEMAS = {
    "tldr": (TLDRPreferenceDataModule, comparison_row, 1, ("choice", lambda r: r.update(choice="1"))),
    "binarized": (UltraFeedbackPreferenceDataModule, binarized_row, 1,
                  ("score_chosen", lambda r: r.update(score_chosen="8.5"))),
    "openbmb": (UltraFeedbackSingleDataModule, _openbmb, 3,
                ("completions[1].overall_score", lambda r: r["completions"][1].update(overall_score="7"))),
}


def _lines(rows) -> list[bytes]:
    return [(json.dumps(r) + "\n").encode() for r in rows]


def _corrupt(kind: str, schema: str) -> tuple[list[bytes], str, str]:
    """(file lines, expected field, expected words in the detail) with line 3 broken."""
    _, build, _, (field, mutate) = SCHEMAS[schema]
    rows = [build(k) for k in range(N)]
    lines = _lines(rows)
    if kind == "non_utf8":
        lines[BAD] = lines[BAD].replace(b'"', b'"\xff', 1)
        return lines, "(line)", "byte 0xff at column 3 is not UTF-8"
    if kind == "bad_json":
        lines[BAD] = lines[BAD][: len(lines[BAD]) // 2] + b"\n"
        return lines, "(line)", "at column"
    if kind == "not_object":
        lines[BAD] = b'["a", "list"]\n'
        return lines, "(row)", "expected a JSON object, found an array of 2"
    mutate(rows[BAD])
    return _lines(rows), field, "expected a"


def _dm(schema: str, path: str, tokenizer, on_bad_rows: str):
    cls = SCHEMAS[schema][0]
    kwargs = {} if cls is UltraFeedbackSingleDataModule else {"test_split": None}
    return cls(path, tokenizer, train_split="train", val_split=None, max_prompt_length=200, on_bad_rows=on_bad_rows,
               **kwargs)


KINDS = ["non_utf8", "bad_json", "not_object", "wrong_type"]


@pytest.mark.parametrize("schema", list(SCHEMAS))
@pytest.mark.parametrize("kind", KINDS)
def test_unreadable_or_mistyped_row_error_names_file_line_field(schema, kind, tiny_tokenizer, tmp_path):
    lines, field, words = _corrupt(kind, schema)
    path = tmp_path / f"{schema}.jsonl"
    path.write_bytes(b"".join(lines))
    with pytest.raises(BadRowError) as err:
        _dm(schema, str(path), tiny_tokenizer, "error").setup("fit")
    msg = str(err.value)
    assert f"{path}, line {BAD + 1} " in msg and f"field {field!r}" in msg and words in msg, msg
    assert err.value.field == field and err.value.location == f"line {BAD + 1}" and err.value.row == BAD
    assert "\n" not in msg  # one clear line, no traceback from a reader


@pytest.mark.parametrize("schema", list(SCHEMAS))
@pytest.mark.parametrize("kind", KINDS)
def test_unreadable_or_mistyped_row_skip_is_reported(schema, kind, tiny_tokenizer, tmp_path, caplog):
    lines, field, words = _corrupt(kind, schema)
    path = tmp_path / f"{schema}.jsonl"
    path.write_bytes(b"".join(lines))
    dm = _dm(schema, str(path), tiny_tokenizer, "skip")
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.data"):
        dm.setup("fit")
    per_row = SCHEMAS[schema][2]
    assert len(dm.dataset("train")) == (N - 1) * per_row
    assert BAD not in set(dm.dataset("train")["_row"])
    [record] = dm.bad_rows
    assert record["file"] == str(path) and record["location"] == f"line {BAD + 1}" and record["row"] == BAD
    assert record["field"] == field and words in record["detail"]
    assert sum(dm.skipped_rows.values()) == 1
    assert any(f"line {BAD + 1}" in r.getMessage() and field in r.getMessage() for r in caplog.records)


def test_no_coercion_of_strings_that_look_like_numbers(tiny_tokenizer, tmp_path):
    """`post: "2024"` stays a string; a string `choice` or a float `choice` is a bad row, named."""
    rows = [comparison_row(k) for k in range(N)]
    rows[0]["info"]["post"] = "2024"
    rows[1]["choice"] = "1"
    rows[3]["choice"] = 1.0
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    dm = TLDRPreferenceDataModule(path, tiny_tokenizer, val_split=None, on_bad_rows="skip")
    dm.setup("fit")
    ds = dm.dataset("train")
    assert list(ds["_row"]) == [0, 2, 4]
    assert ds[0]["prompt"].endswith("POST: 2024\n\nTL;DR:")
    assert [(r["location"], r["field"], r["detail"]) for r in dm.bad_rows] == [
        ("line 2", "choice", "expected an integer, found a string '1'"),
        ("line 4", "choice", "expected an integer, found a number 1.0"),
    ]
    # an integer score is a valid float; a string score is not
    rows = [binarized_row(k) for k in range(3)]
    rows[0]["score_chosen"] = 8
    rows[1]["score_rejected"] = "8.5"
    path = write_jsonl(tmp_path / "b.jsonl", rows)
    with pytest.raises(BadRowError, match=r"line 2 .*field 'score_rejected': expected a number, found a string '8.5'"):
        UltraFeedbackPreferenceDataModule(path, tiny_tokenizer, train_split="train", val_split=None).setup("fit")
    # a valid SFT post that looks like a number
    path = write_jsonl(tmp_path / "s.jsonl", [tldr_sft_row(0, post="2024"), tldr_sft_row(1)])
    dm = TLDRSFTDataModule(path, tiny_tokenizer, val_split=None, test_split=None)
    dm.setup("fit")
    assert dm.dataset("train")[0]["prompt"].endswith("POST: 2024\n\nTL;DR:")


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_empty_missing_and_dataless_sources(schema, tiny_tokenizer, tmp_path):
    for mode in ("error", "skip"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text("\n")
        with pytest.raises(DataSourceError, match=rf"split 'train' has no rows: {empty} is empty"):
            _dm(schema, str(empty), tiny_tokenizer, mode).setup("fit")
        with pytest.raises(DataSourceError, match="does not exist"):
            _dm(schema, str(tmp_path / "missing.jsonl"), tiny_tokenizer, mode).setup("fit")
        nodata = tmp_path / "nodata"
        nodata.mkdir(exist_ok=True)
        (nodata / "notes.txt").write_text("no rows here")
        with pytest.raises(DataSourceError, match=r"has no data files .*notes.txt"):
            _dm(schema, str(nodata), tiny_tokenizer, mode).setup("fit")


def test_json_array_and_parquet_name_the_record(tiny_tokenizer, tmp_path):
    rows = [comparison_row(k) for k in range(N)]
    rows[BAD]["summaries"][1]["text"] = 5
    path = tmp_path / "c.json"
    path.write_text(json.dumps(rows, indent=1))
    with pytest.raises(BadRowError, match=rf"{path}, record {BAD + 1} .*field 'summaries\[1\].text': expected a "
                                          "string, found an integer 5"):
        TLDRPreferenceDataModule(str(path), tiny_tokenizer, val_split=None).setup("fit")
    path.write_text(json.dumps(rows)[:-40])
    with pytest.raises(DataSourceError, match=rf"{path}, line 1 column \d+: not valid JSON"):
        TLDRPreferenceDataModule(str(path), tiny_tokenizer, val_split=None).setup("fit")
    # parquet columns are typed: a string score column is wrong from its first record on
    bin_rows = [dict(binarized_row(k), score_chosen=str(8.0)) for k in range(3)]
    ppath = write_parquet(tmp_path / "b.parquet", bin_rows)
    with pytest.raises(BadRowError, match=r"b.parquet, record 1 .*field 'score_chosen': expected a number, "
                                          "found a string '8.0'"):
        UltraFeedbackPreferenceDataModule(ppath, tiny_tokenizer, train_split="train", val_split=None).setup("fit")
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(DataSourceError, match="cannot be read as parquet"):
        UltraFeedbackPreferenceDataModule(str(bad), tiny_tokenizer, train_split="train", val_split=None).setup("fit")


def test_typed_source_columns_are_checked(tiny_tokenizer, tmp_path):
    import datasets

    rows = [dict(comparison_row(k), choice=str(k % 2)) for k in range(3)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataSourceError, match=r"column 'choice': expected int, found string"):
        TLDRPreferenceDataModule(str(tmp_path / "saved"), tiny_tokenizer, val_split=None).setup("fit")


def test_large_file_bad_line_past_the_first_10mb_block(tiny_tokenizer, tmp_path):
    """A >10 MB JSONL file (rows made long by a 4 KB note that is not tokenised) with its bad line
    after the first 10 MB: the error names that exact line; skip mode drops only that row."""
    n, bad_index = 3000, 2900
    note = "n" * 4000
    lines = []
    for k in range(n):
        row = comparison_row(k)
        row["summaries"][0]["note"] = note
        lines.append((json.dumps(row) + "\n").encode())
    lines[bad_index] = lines[bad_index].replace(b'"choice": ', b'"choice": "', 1).replace(b', "worker"', b'", "worker"', 1)
    assert sum(len(x) for x in lines[:bad_index]) > 10 * 2**20
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(lines))
    with pytest.raises(BadRowError, match=rf"big.jsonl, line {bad_index + 1} \(split 'train', row {bad_index}\): "
                                          "field 'choice': expected an integer, found a string"):
        TLDRPreferenceDataModule(str(path), tiny_tokenizer, val_split=None).setup("fit")
    dm = TLDRPreferenceDataModule(str(path), tiny_tokenizer, val_split=None, on_bad_rows="skip", limit=None)
    dm.setup("fit")
    assert len(dm.dataset("train")) == n - 1
    assert [(r["location"], r["field"]) for r in dm.bad_rows] == [(f"line {bad_index + 1}", "choice")]


def test_skip_report_next_to_the_logs(tiny_tokenizer, tmp_path):
    import lightning as L

    rows = [comparison_row(k) for k in range(N)]
    rows[1]["choice"] = 2
    rows[3]["info"]["post"] = ""
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    dm = TLDRPreferenceDataModule(path, tiny_tokenizer, val_split=None, on_bad_rows="skip")
    dm.trainer = L.Trainer(default_root_dir=str(tmp_path / "run"), logger=False, enable_progress_bar=False,
                           enable_model_summary=False)
    dm.setup("fit")
    report = tmp_path / "run" / "bad_rows.csv"
    assert dm.bad_rows_report == report
    got = list(csv.DictReader(report.open()))
    assert [(r["file"], r["location"], r["row"], r["field"], r["reason"]) for r in got] == [
        (path, "line 2", "1", "choice", "choice not 0/1"),
        (path, "line 4", "3", "info.post", "missing or empty field"),
    ]


def test_processed_cache_follows_the_formatting_code(tiny_tokenizer, tmp_path, monkeypatch):
    import importlib
    import sys

    from lit_rlhf.data import processing

    path = write_jsonl(tmp_path / "d.jsonl", [tldr_sft_row(k) for k in range(4)])

    def cache_file():
        dm = TLDRSFTDataModule(path, tiny_tokenizer, val_split=None, test_split=None)
        dm.setup("fit")
        return {f["filename"] for f in dm.dataset("train").cache_files}

    first = cache_file()
    assert cache_file() == first
    monkeypatch.setattr("lit_rlhf.data.base.code_fingerprint", lambda formatter: "edited formatter")
    assert cache_file() != first  # the code fingerprint is part of the cache key

    # and the fingerprint follows a formatter module's source
    module = tmp_path / "my_formatter.py"
    module.write_text("from lit_rlhf.data.processing import Formatter\nclass F(Formatter):\n    x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("my_formatter")
    before = processing.code_fingerprint(mod.F())
    module.write_text("from lit_rlhf.data.processing import Formatter\nclass F(Formatter):\n    x = 2\n")
    mod = importlib.reload(mod)
    assert processing.code_fingerprint(mod.F()) != before
    sys.modules.pop("my_formatter", None)
