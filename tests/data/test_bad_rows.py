"""Every bad-row case: an error naming source, split, row index and field; or a counted skip."""

from __future__ import annotations

import logging
import math

import pytest

from lit_rlhf.data import (
    BadRowError,
    TLDRPreferenceDataModule,
    TLDRPromptDataModule,
    TLDRSFTDataModule,
    UltraFeedbackPreferenceDataModule,
    UltraFeedbackSingleDataModule,
)
from lit_rlhf.data.formatting import (
    BAD_CHOICE,
    COMPLETION_TOO_LONG,
    IDENTICAL,
    MISSING,
    NON_FINITE,
    PROMPT_TOO_LONG,
)
from tests.data.conftest import binarized_row, openbmb_row, tldr_sft_row, write_jsonl, write_parquet

BAD = 2  # index of the broken row in every case
N = 4


def comparison_row(k: int) -> dict:
    """One raw comparisons row (no `site` / `article`, as in the raw files)."""
    return {
        "info": {"id": f"t3_{k}", "post": f"Post {k}.\n\nMore {k}.", "title": f"Title {k}", "subreddit": "test"},
        "split": "train",
        "summaries": [{"text": f" Good summary {k}.", "policy": "a", "note": ""},
                      {"text": f" Bad summary {k}.", "policy": "b", "note": ""}],
        "choice": k % 2,
        "worker": "w",
        "batch": "batch1",
        "extra": {"confidence": 5},
    }


def _set(path: str, value):
    def mutate(row):
        *parents, leaf = path.split(".")
        target = row
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        if value is _DELETE:
            del target[leaf]
        else:
            target[int(leaf) if leaf.isdigit() else leaf] = value
    return mutate


_DELETE = object()

# (id, DataModule class, row builder, mutation, file kind, extra kwargs, expected field, expected reason)
CASES = [
    ("sft-missing-summary", TLDRSFTDataModule, tldr_sft_row, _set("summary", None), "jsonl", {}, "summary", MISSING),
    ("sft-empty-title", TLDRSFTDataModule, tldr_sft_row, _set("title", "  "), "jsonl", {}, "title", MISSING),
    ("sft-long-summary", TLDRSFTDataModule, tldr_sft_row, _set("summary", "word " * 20), "jsonl", {}, "summary",
     COMPLETION_TOO_LONG),
    ("sft-prompt-cannot-fit", TLDRSFTDataModule, tldr_sft_row, _set("title", "T" * 300), "jsonl", {}, "title",
     PROMPT_TOO_LONG),
    ("prompts-empty-post", TLDRPromptDataModule, tldr_sft_row, _set("post", ""), "jsonl", {}, "post", MISSING),
    ("cmp-choice-2", TLDRPreferenceDataModule, comparison_row, _set("choice", 2), "jsonl", {}, "choice", BAD_CHOICE),
    ("cmp-identical", TLDRPreferenceDataModule, comparison_row, _set("summaries.1.text", " Good summary 2."), "jsonl",
     {}, "summaries", IDENTICAL),
    ("cmp-no-post", TLDRPreferenceDataModule, comparison_row, _set("info.post", _DELETE), "jsonl", {}, "info.post",
     MISSING),
    ("cmp-empty-summary", TLDRPreferenceDataModule, comparison_row, _set("summaries.0.text", ""), "jsonl", {},
     "summaries[0].text", MISSING),
    ("cmp-no-confidence", TLDRPreferenceDataModule, comparison_row, _set("extra.confidence", None), "jsonl",
     {"margin_from": "confidence"}, "extra.confidence", MISSING),
    ("uf-nan-score", UltraFeedbackPreferenceDataModule, binarized_row, _set("score_chosen", math.nan), "parquet", {},
     "score_chosen", NON_FINITE),
    ("uf-identical", UltraFeedbackPreferenceDataModule, binarized_row, _set("rejected.1.content", "Colour 2 is blue."),
     "jsonl", {}, "rejected", IDENTICAL),
    ("uf-empty-answer", UltraFeedbackPreferenceDataModule, binarized_row, _set("chosen.1.content", ""), "jsonl", {},
     "chosen[1].content", MISSING),
    ("uf-long-prompt", UltraFeedbackPreferenceDataModule, binarized_row, lambda r: [m.update(content="x" * 300)
     for m in (r["chosen"][0], r["rejected"][0])], "jsonl", {}, "chosen", PROMPT_TOO_LONG),
    ("ufs-inf-score", UltraFeedbackSingleDataModule, lambda k: openbmb_row(k, [5.0, 6.0, 7.0]),
     _set("completions.1.overall_score", math.inf), "parquet", {}, "completions[1].overall_score", NON_FINITE),
    ("ufs-empty-instruction", UltraFeedbackSingleDataModule, lambda k: openbmb_row(k, [5.0, 6.0, 7.0]),
     _set("instruction", ""), "jsonl", {}, "instruction", MISSING),
]


def _make(case, tmp_path, tokenizer, on_bad_rows):
    _, cls, build, mutate, kind, kwargs, _, _ = case
    rows = [build(k) for k in range(N)]
    mutate(rows[BAD])
    writer = write_jsonl if kind == "jsonl" else write_parquet
    path = writer(tmp_path / f"data.{kind}", rows)
    kwargs = dict(kwargs)
    if cls is not UltraFeedbackSingleDataModule:
        kwargs.update(test_split=None)
    if cls is not TLDRPromptDataModule:
        kwargs.update(max_completion_length=40)
    return path, cls(path, tokenizer, train_split="train", val_split=None, max_prompt_length=200,
                     on_bad_rows=on_bad_rows, **kwargs)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_row_error_names_source_split_row_field(case, tiny_tokenizer, tmp_path):
    path, dm = _make(case, tmp_path, tiny_tokenizer, "error")
    with pytest.raises(BadRowError) as err:
        dm.setup("fit")
    msg = str(err.value)
    assert path in msg and "split 'train'" in msg and f"row {BAD}" in msg and f"field {case[6]!r}" in msg, msg
    assert err.value.row == BAD and err.value.field == case[6] and err.value.reason == case[7]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_row_skip_is_counted_and_logged(case, tiny_tokenizer, tmp_path, caplog):
    _, dm = _make(case, tmp_path, tiny_tokenizer, "skip")
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.data"):
        dm.setup("fit")
    assert dict(dm.skipped_rows) == {case[7]: 1}
    assert dm.skipped_rows_by_split["train"] == {case[7]: 1}
    per_row = 3 if case[1] is UltraFeedbackSingleDataModule else 1  # one example per completion
    expected = N * per_row - 1 if case[0] == "ufs-inf-score" else (N - 1) * per_row
    assert len(dm.dataset("train")) == expected
    assert any("skipped 1" in r.getMessage() and case[7] in r.getMessage() for r in caplog.records)
    assert BAD not in set(dm.dataset("train")["_row"]) or case[0] == "ufs-inf-score"


def test_truncate_completions_keeps_eos(tiny_tokenizer, tmp_path):
    rows = [tldr_sft_row(k) for k in range(N)]
    rows[BAD]["summary"] = "word " * 20
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    dm = TLDRSFTDataModule(path, tiny_tokenizer, val_split=None, test_split=None, max_completion_length=40,
                           truncate_completions=True)
    dm.setup("fit")
    ids = dm.dataset("train")[BAD]["_completion_ids"]
    assert len(ids) == 40 and ids[-1] == tiny_tokenizer.eos_token_id and not dm.skipped_rows
