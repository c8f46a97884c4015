"""Every kind of source goes through `datasets`: saved dirs, data_files, parquet, sliced splits, caching."""

from __future__ import annotations

import datasets
import pytest

from lit_rlhf.data import BadRowError, TLDRSFTDataModule
from lit_rlhf.data.base import parse_split, slice_range
from tests.data.conftest import tldr_sft_row, write_jsonl, write_parquet


def _rows(n, start=0):
    return [tldr_sft_row(k) for k in range(start, start + n)]


def test_parse_and_slice():
    assert parse_split("train") == ("train", None, None)
    assert parse_split("train[10:20%]") == ("train", "10", "20%")
    assert list(slice_range(10, None, "30%")) == [0, 1, 2]
    assert list(slice_range(10, "-2", None)) == [8, 9]
    with pytest.raises(ValueError, match="cannot parse split"):
        parse_split("train[1:2")


def test_saved_to_disk_directory(tiny_tokenizer, tmp_path):
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows(6)),
                          "validation": datasets.Dataset.from_list(_rows(2, 10))}).save_to_disk(str(tmp_path / "saved"))
    dm = TLDRSFTDataModule(str(tmp_path / "saved"), tiny_tokenizer, test_split=None)
    dm.setup("fit")
    assert len(dm.dataset("train")) == 6 and dm.dataset("val")["id"] == ["t3_10", "t3_11"]


def test_data_files_per_split(tiny_tokenizer, tmp_path):
    write_parquet(tmp_path / "a.parquet", _rows(5))
    write_parquet(tmp_path / "b.parquet", _rows(3, 20))
    dm = TLDRSFTDataModule(str(tmp_path), tiny_tokenizer, data_files={"train": "a.parquet", "dev": "b.parquet"},
                           val_split="dev", test_split=None)
    dm.setup("fit")
    assert len(dm.dataset("train")) == 5 and len(dm.dataset("val")) == 3


def test_missing_split_is_explained(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", _rows(3))
    dm = TLDRSFTDataModule(path, tiny_tokenizer, test_split=None)
    with pytest.raises(Exception, match="split 'validation' not found.*split_map"):
        dm.setup("fit")


def test_sliced_split_reports_absolute_row(tiny_tokenizer, tmp_path):
    rows = _rows(10)
    rows[7]["summary"] = ""
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    dm = TLDRSFTDataModule(path, tiny_tokenizer, train_split="train[50%:]", val_split="train[:50%]", test_split=None)
    with pytest.raises(BadRowError, match=r"split 'train\[50%:\]', row 7\)"):
        dm.setup("fit")
    dm = TLDRSFTDataModule(path, tiny_tokenizer, train_split="train[:5]", val_split=None, test_split=None)
    dm.setup("fit")
    assert dm.dataset("train")["id"] == [f"t3_{k}" for k in range(5)]


def test_tokenisation_is_cached(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", _rows(8))

    def build(**kw):
        dm = TLDRSFTDataModule(path, tiny_tokenizer, val_split=None, test_split=None, **kw)
        dm.setup("fit")
        return {f["filename"] for f in dm.dataset("train").cache_files}

    first = build()
    assert first and build() == first  # the same processed file: `datasets.map` ran once
    assert build(max_prompt_length=100) != first  # a formatting option changes the fingerprint
