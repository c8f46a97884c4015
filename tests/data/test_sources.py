"""Every kind of source goes through `datasets`: saved dirs, data_files, parquet, sliced splits, caching."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from lit_rlhf.data import BadRowError, TLDRSFTDataModule
from lit_rlhf.data.sources import parse_split, slice_range
from tests.data.conftest import tldr_sft_row, write_jsonl, write_parquet

ROOT = Path(__file__).resolve().parents[2]


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


def test_slice_beyond_the_rows_is_named():
    from lit_rlhf.data.sources import slice_problem

    assert slice_problem(32, None, "24") is None and slice_problem(32, "-32", None) is None
    assert slice_problem(32, "32", None) == "the slice selects none of them"
    assert slice_problem(32, None, "0") == "the slice selects none of them"
    assert slice_problem(32, "99%", None) == "the slice selects none of them"  # round(31.68) = 32
    assert slice_problem(32, "1000", None) == "the slice's start 1000 is beyond them"
    assert slice_problem(32, None, "1000") == "the slice's stop 1000 is beyond them"
    assert slice_problem(32, "-33", None) == "the slice's start -33 is beyond them"
    assert slice_problem(32, None, "150%") == "the slice's stop 150% is beyond 100%"


@pytest.mark.parametrize("recipe", ["drov", "kto", "kto_dro_baseline"])
def test_recipe_slices_on_the_bundled_sample_are_named_at_setup(recipe, tiny_tokenizer):
    """The UltraFeedback single-trajectory recipes hold out `train[:1000]` and train on
    `train[1000:]`; on the 32-row bundled sample that is a named error before any row is
    formatted, not an IndexError from `datasets`."""
    import yaml

    from lit_rlhf.data import UltraFeedbackSingleDataModule
    from lit_rlhf.data.sources import DataSourceError, bundled_aliases

    data = yaml.safe_load((ROOT / "configs" / "ultrafeedback" / f"{recipe}.yaml").read_text())["data"]
    assert data["class_path"].endswith("UltraFeedbackSingleDataModule")
    args = {k: v for k, v in data["init_args"].items() if k not in ("path", "tokenizer")}
    train_split, val_split = args["train_split"], args["val_split"]
    assert (train_split, val_split) == ("train[1000:]", "train[:1000]")
    file = bundled_aliases()["ultrafeedback"]["train"]
    dm = UltraFeedbackSingleDataModule("bundled:ultrafeedback", tiny_tokenizer, **args)
    for step in (dm.prepare_data, lambda: dm.setup("fit")):
        with pytest.raises(DataSourceError) as err:
            step()
        assert str(err.value) == (
            f"split 'train[1000:]' of bundled:ultrafeedback ({file}) is out of range: split 'train' has 32 row(s), "
            "and the slice's start 1000 is beyond them. Choose bounds within its 32 row(s), or percentages "
            "('train[:90%]', 'train[90%:]').")
    assert dm.datasets == {}  # found before any split was formatted
    dm = UltraFeedbackSingleDataModule("bundled:ultrafeedback", tiny_tokenizer, **dict(args, train_split="train[:24]"))
    with pytest.raises(DataSourceError, match=r"split 'train\[:1000\]' .*stop 1000 is beyond them"):
        dm.setup("fit")


def test_empty_slice_of_a_file_is_named(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", _rows(6))
    dm = TLDRSFTDataModule(path, tiny_tokenizer, train_split="train[:0]", val_split=None, test_split=None)
    with pytest.raises(Exception, match=rf"split 'train\[:0\]' of {path} is out of range: split 'train' has 6 "
                                        r"row\(s\), and the slice selects none of them"):
        dm.setup("fit")


def test_a_datamodule_states_only_its_own_defaults():
    """`defaults` reach the signature the CLI reads and Python calls alike; hparams record every argument."""
    import inspect

    from lit_rlhf.data import QADataModule, UltraFeedbackPreferenceDataModule

    sig = inspect.signature(UltraFeedbackPreferenceDataModule)
    assert sig.parameters["val_split"].default == "test_prefs" and sig.parameters["margin_from"].default is None
    dm = UltraFeedbackPreferenceDataModule(limit=2)
    assert dm.splits == {"train": "train_prefs", "val": "test_prefs", "test": None}
    assert dm.hparams["limit"] == 2 and dm.hparams["max_completion_length"] == 1024
    assert QADataModule("bundled:arithmetic", chat=False).splits["test"] == "test"
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        QADataModule(nope=1)
