"""openbmb/UltraFeedback rows in their full published structure (nested annotation objects,
ratings as strings such as "4" or "N/A", some values null, and annotation keys beyond the
published ones, which rows met in practice carry): every corrupt row named by file, line, split,
row and field in error mode, and skipped, counted and listed in the bad-rows report in skip mode,
as for the TL;DR and binarized schemas (`tests/data/test_corrupt_inputs.py`)."""

from __future__ import annotations

import csv
import json

import pytest

from lit_rlhf.data import BadRowError, TLDRSFTDataModule, UltraFeedbackSingleDataModule
from lit_rlhf.data import schema as schemas
from lit_rlhf.data.formatting import MISSING
from lit_rlhf.data.readers import NOT_JSON, NOT_UTF8, WRONG_TYPE
from tests.data.conftest import write_jsonl, write_parquet

N = 5
BAD = 2  # 0-based index of the broken row: line 3
SCORES = [6.0, 7.5, 4.0]


def published_completion(j: int, k: int, overall: float, extra_keys: bool) -> dict:
    """One completion as `openbmb/UltraFeedback` publishes it (keys in its order)."""
    honesty = {"Rating": "N/A" if j == 2 else str(3 + j % 2), "Rationale": None if j == 2 else "Confident and right."}
    if extra_keys:
        honesty["Rating For Rationale"] = "5"  # not in the published schema: dropped, logged
    return {
        "model": f"model-{j}",
        "custom_system_prompt": "You are a helpful assistant.",
        "principle": "helpfulness",
        "response": f"Answer {j} to {k}.",
        "annotations": {
            "instruction_following": {"Rating": "4", "Rationale": "Follows the instruction."},
            "honesty": honesty,
            "truthfulness": {"Type": ["0"], "Rationale": "No hallucination.", "Rating": "5",
                             "Rationale For Rating": None},
            "helpfulness": {"Type": ["1", "2"], "Rationale": "Clear.", "Rating": "4",
                            "Rationale For Rating": "Accurate and informative."},
        },
        "fine-grained_score": overall / 2,
        "overall_score": overall,
        "critique": None if j == 1 else "Could be shorter.",
    }


def published_row(k: int, extra_keys: bool = True) -> dict:
    return {
        "source": "evol_instruct",
        "instruction": f"Count to {k}.",
        "models": [f"model-{j}" for j in range(len(SCORES))],
        "completions": [published_completion(j, k, s, extra_keys) for j, s in enumerate(SCORES)],
        "correct_answers": ["None"],
        "incorrect_answers": [],
    }


def _completion(j: int):
    return lambda r: r["completions"][j]


# corruption -> (mutation of the row or of its line, field, reason, words in the detail, examples left in skip mode)
PER_ROW = len(SCORES)
CORRUPTIONS = {
    "not_json": (lambda line: line[: len(line) // 2] + b"\n", "(line)", NOT_JSON, "at column", (N - 1) * PER_ROW),
    "not_utf8": (lambda line: line.replace(b'"', b'"\xff', 1), "(line)", NOT_UTF8, "byte 0xff", (N - 1) * PER_ROW),
    "score_na": (lambda r: r["completions"][1].update(overall_score="N/A"), "completions[1].overall_score",
                 WRONG_TYPE, "expected a number, found a string 'N/A'", (N - 1) * PER_ROW),
    "score_string": (lambda r: r["completions"][1].update(overall_score="6.0"), "completions[1].overall_score",
                     WRONG_TYPE, "expected a number, found a string '6.0'", (N - 1) * PER_ROW),
    "instruction_list": (lambda r: r.update(instruction=["Count", "to 2."]), "instruction", WRONG_TYPE,
                         "expected a string, found an array of 2", (N - 1) * PER_ROW),
    "no_completions": (lambda r: r.pop("completions"), "completions", MISSING, "expected a non-empty list",
                       (N - 1) * PER_ROW),
    "empty_completions": (lambda r: r.update(completions=[]), "completions", MISSING, "expected a non-empty list",
                          (N - 1) * PER_ROW),
    # a bad completion is dropped on its own; the row's other completions stay
    "empty_response": (lambda r: r["completions"][1].update(response=""), "completions[1].response", MISSING,
                       "empty string", N * PER_ROW - 1),
    "no_overall_score": (lambda r: r["completions"][1].pop("overall_score"), "completions[1].overall_score", MISSING,
                         "missing", N * PER_ROW - 1),
}
LINE_LEVEL = ("not_json", "not_utf8")


def _lines(corruptions: dict[int, str]) -> list[bytes]:
    """JSON lines of N published rows (more if needed), row i broken by `corruptions[i]`."""
    rows = [published_row(k) for k in range(max([N] + [i + 2 for i in corruptions]))]
    for i, kind in corruptions.items():
        if kind not in LINE_LEVEL:
            CORRUPTIONS[kind][0](rows[i])
    lines = [(json.dumps(r) + "\n").encode() for r in rows]
    for i, kind in corruptions.items():
        if kind in LINE_LEVEL:
            lines[i] = CORRUPTIONS[kind][0](lines[i])
    return lines


def _dm(path, tokenizer, on_bad_rows: str) -> UltraFeedbackSingleDataModule:
    return UltraFeedbackSingleDataModule(str(path), tokenizer, train_split="train", val_split=None,
                                         max_prompt_length=200, on_bad_rows=on_bad_rows)


def test_published_rows_read_whole(tiny_tokenizer, tmp_path):
    """Rows in the published structure, with keys beyond it, load in every file format; the
    undeclared keys are dropped (and logged), the declared nested values kept as they are."""
    rows = [published_row(k) for k in range(N)]
    jsonl = write_jsonl(tmp_path / "uf.jsonl", rows)
    array = tmp_path / "uf.json"
    array.write_text(json.dumps(rows))
    parquet = write_parquet(tmp_path / "uf.parquet", rows)
    for path in (jsonl, str(array), parquet):
        dm = _dm(path, tiny_tokenizer, "error")
        dm.setup("fit")
        ds = dm.dataset("train")
        assert len(ds) == N * PER_ROW and dm.bad_rows == []
        assert list(ds["_reward"][:PER_ROW]) == SCORES
    raw = dm.source.load("train")
    honesty = raw[0]["completions"][2]["annotations"]["honesty"]
    assert honesty == {"Rating": "N/A", "Rationale": None}
    assert raw[0]["completions"][0]["annotations"]["truthfulness"]["Type"] == ["0"]


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_published_row_error_names_file_line_field(kind, tiny_tokenizer, tmp_path):
    _, field, reason, words, _ = CORRUPTIONS[kind]
    path = tmp_path / "uf.jsonl"
    path.write_bytes(b"".join(_lines({BAD: kind})))
    with pytest.raises(BadRowError) as err:
        _dm(path, tiny_tokenizer, "error").setup("fit")
    msg = str(err.value)
    assert f"{path}, line {BAD + 1} (split 'train', row {BAD}): field {field!r}" in msg and words in msg, msg
    assert (err.value.field, err.value.reason, err.value.row) == (field, reason, BAD)
    assert "\n" not in msg


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_published_row_skip_is_counted(kind, tiny_tokenizer, tmp_path):
    _, field, reason, words, left = CORRUPTIONS[kind]
    path = tmp_path / "uf.jsonl"
    path.write_bytes(b"".join(_lines({BAD: kind})))
    dm = _dm(path, tiny_tokenizer, "skip")
    dm.setup("fit")
    assert len(dm.dataset("train")) == left
    assert dict(dm.skipped_rows) == {reason: 1}
    [record] = dm.bad_rows
    assert {k: record[k] for k in ("file", "split", "location", "row", "field", "reason")} == {
        "file": str(path), "split": "train", "location": f"line {BAD + 1}", "row": BAD, "field": field,
        "reason": reason}
    assert words in record["detail"]


def test_every_corruption_listed_in_the_bad_rows_report(tiny_tokenizer, tmp_path):
    """One file with each corruption on its own line: skip mode keeps the good rows and the
    report lists every skipped row by file, split, line, row, field and reason."""
    import lightning as L

    kinds = list(CORRUPTIONS)
    at = {1 + 2 * i: kind for i, kind in enumerate(kinds)}  # a good row between two bad ones
    path = tmp_path / "uf.jsonl"
    lines = _lines(at)
    path.write_bytes(b"".join(lines))
    dm = _dm(path, tiny_tokenizer, "skip")
    dm.trainer = L.Trainer(default_root_dir=str(tmp_path / "run"), logger=False, enable_progress_bar=False,
                           enable_model_summary=False)
    dm.setup("fit")
    partial = sum(1 for k in kinds if CORRUPTIONS[k][4] == N * PER_ROW - 1)
    assert len(dm.dataset("train")) == (len(lines) - len(kinds)) * PER_ROW + partial * (PER_ROW - 1)
    got = list(csv.DictReader(dm.bad_rows_report.open()))
    assert [(r["file"], r["split"], r["location"], r["row"], r["field"], r["reason"]) for r in got] == [
        (str(path), "train", f"line {i + 1}", str(i), CORRUPTIONS[kind][1], CORRUPTIONS[kind][2])
        for i, kind in sorted(at.items())]


def test_unpaired_surrogate_is_a_named_bad_row(tiny_tokenizer, tmp_path):
    """A JSON `\\ud800` escape decodes to a string with no UTF-8 form: a bad row naming the field,
    not an encoding error from the arrow writer."""
    rows = [{"id": f"t3_{k}", "subreddit": "test", "title": f"Title {k}", "post": f"Post {k}.", "summary": "S."}
            for k in range(N)]
    path = tmp_path / "sft.jsonl"
    lines = [json.dumps(r) for r in rows]
    lines[BAD] = lines[BAD].replace('"Post 2.', '"Post \\ud800 2.')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadRowError, match=rf"line {BAD + 1} .*field 'post': expected a string of valid Unicode, "
                                          "found an unpaired surrogate U\\+D800 at character 6"):
        TLDRSFTDataModule(str(path), tiny_tokenizer, val_split=None, test_split=None).setup("fit")
    dm = TLDRSFTDataModule(str(path), tiny_tokenizer, val_split=None, test_split=None, on_bad_rows="skip")
    dm.setup("fit")
    assert len(dm.dataset("train")) == N - 1 and [r["field"] for r in dm.bad_rows] == ["post"]


def test_conform_keeps_only_what_the_schema_declares():
    spec = {"a": [{"x": float, "n": int}], "s": str}
    unknown: dict[str, str] = {}
    got = schemas.conform({"a": [{"x": 1, "n": 2, "extra": {"deep": 1}}, None, {"x": 0.5}], "s": "t", "top": 1},
                          spec, "", unknown)
    assert got == {"a": [{"x": 1.0, "n": 2}, None, {"x": 0.5}], "s": "t"}
    assert isinstance(got["a"][0]["x"], float)
    assert unknown == {"a[].extra": "a[0].extra", "top": "top"}
    with pytest.raises(schemas.TypeMismatch, match=r"a\[0\]\.n: expected a 64-bit integer"):
        schemas.conform({"a": [{"n": 2**63}]}, spec, "")
    with pytest.raises(schemas.TypeMismatch, match=r"a\[0\]\.x: expected a number within the 64-bit float range"):
        schemas.conform({"a": [{"x": 10**400}]}, spec, "")
