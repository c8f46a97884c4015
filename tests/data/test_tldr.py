"""TL;DR DataModules on the real comparison rows (../shared/data) and on rows built in the SFT schema."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.data import (
    DataSourceError,
    TLDRPreferenceDataModule,
    TLDRPromptDataModule,
    TLDRSFTDataModule,
)
from lit_rlhf.data.formatting import encode_prompt, format_tldr_completion, format_tldr_query
from lit_rlhf.types import PreferenceBatch, PromptBatch, SFTBatch
from tests.data.conftest import read_jsonl, tldr_sft_row, write_jsonl

POST_PREFIX = "\n\nPOST: "


def _check_d2(prompt: str, info: dict) -> None:
    """The prompt is the D2 query of the post, or of the post cut at a paragraph boundary."""
    head = f"SUBREDDIT: r/{info['subreddit']}\n\nTITLE: {info['title']}{POST_PREFIX}"
    assert prompt.startswith(head) and prompt.endswith("\n\nTL;DR:") and not prompt.endswith(" ")
    kept = prompt[len(head): -len("\n\nTL;DR:")]
    if kept == info["post"]:
        assert prompt == format_tldr_query(info["subreddit"], info["title"], info["post"])
    else:  # paragraph truncation: a prefix of the post, followed in the post by a newline ...
        assert info["post"].startswith(kept)
        rest = info["post"][len(kept):]
        if not rest.lstrip(" \t").startswith("\n"):
            # ... or, as a last resort, a cut inside the first paragraph when even that does not fit
            assert "\n" not in kept and "\n" in rest or "\n" not in info["post"]


def _check_right_padded(batch, tokenizer) -> None:
    attn, ids = batch.attention_mask, batch.input_ids
    assert attn.dtype == torch.bool and batch.loss_mask.dtype == torch.bool
    lengths = attn.sum(1)
    for i in range(ids.shape[0]):
        n = int(lengths[i])
        assert attn[i, :n].all() and not attn[i, n:].any()  # right padded
        assert (ids[i, n:] == tokenizer.pad_token_id).all()
        assert ids[i, n - 1] == tokenizer.eos_token_id and batch.loss_mask[i, n - 1]  # EOS is real and scored
        assert not (batch.loss_mask[i] & ~attn[i]).any()


def test_comparisons_sample_chosen_follows_choice(tiny_tokenizer, tldr_comparisons_sample):
    rows = read_jsonl(tldr_comparisons_sample)
    dm = TLDRPreferenceDataModule(str(tldr_comparisons_sample), tiny_tokenizer, val_split=None,
                                  max_completion_length=300, margin_from="confidence", batch_size=16)
    dm.setup("fit")
    assert len(dm.dataset("train")) == len(rows) and not dm.skipped_rows
    loader = torch.utils.data.DataLoader(dm.dataset("train"), batch_size=16, collate_fn=dm._collator("train"))
    batch = next(iter(loader))  # unshuffled: rows in file order
    assert isinstance(batch, PreferenceBatch) and batch.input_ids.shape[0] == 32
    _check_right_padded(batch, tiny_tokenizer)
    eos = tiny_tokenizer.eos_token
    for i, row in enumerate(rows[:16]):
        info, c = row["info"], row["choice"]
        chosen, rejected = row["summaries"][c], row["summaries"][1 - c]
        assert batch.meta["chosen"][i] == chosen["text"]  # already one leading space: not doubled
        assert batch.meta["chosen_policy"][i] == chosen["policy"]
        assert batch.meta["rejected_policy"][i] == rejected["policy"]
        assert batch.meta["batch"][i] == row["batch"] and batch.meta["confidence"][i] == row["extra"]["confidence"]
        assert batch.margin[i] == row["extra"]["confidence"]
        _check_d2(batch.meta["prompt"][i], info)
        for r, text in ((i, chosen["text"]), (16 + i, rejected["text"])):
            p = int(batch.prompt_lengths[r])
            ids = batch.input_ids[r][batch.attention_mask[r]]
            assert tiny_tokenizer.decode(ids[:p]) == batch.meta["prompt"][i]
            assert tiny_tokenizer.decode(batch.input_ids[r][batch.loss_mask[r]]) == text + eos
            assert not batch.loss_mask[r, :p].any()
            assert len(ids) - p == len(text.encode()) + 1  # byte tokens + EOS: the completion is not cut
            assert p <= 512


def test_comparisons_split_map_and_limit(tiny_tokenizer, tldr_comparisons_sample):
    dm = TLDRPreferenceDataModule(str(tldr_comparisons_sample), tiny_tokenizer, train_split=None,
                                  val_split="validation", split_map={"validation": "train"},
                                  max_completion_length=300, limit=10, eval_batch_size=4)
    dm.setup("validate")
    assert len(dm.dataset("val")) == 10
    batches = list(dm.val_dataloader())
    assert [b.num_pairs for b in batches] == [4, 4, 2] and batches[0].margin is None
    assert sum((b.meta["index"] for b in batches), []) == list(range(10))  # row ids in the source split


def test_d2_with_smollm2_on_real_rows(smollm2_tokenizer, tldr_comparisons_sample, tmp_path):
    """Real tokenizer, max_prompt_length 512: real posts, and a post made long by repeating its paragraphs."""
    rows = read_jsonl(tldr_comparisons_sample)[:40]
    long_row = next(r for r in rows if r["info"]["post"].count("\n") >= 2)
    long_post = "\n".join([long_row["info"]["post"]] * 4)
    sft_rows = [{"id": r["info"]["id"], "subreddit": r["info"]["subreddit"], "title": r["info"]["title"],
                 "post": r["info"]["post"], "summary": r["summaries"][r["choice"]]["text"].lstrip()} for r in rows]
    sft_rows.append(dict(sft_rows[rows.index(long_row)], id="long", post=long_post))
    path = write_jsonl(tmp_path / "sft.jsonl", sft_rows)
    dm = TLDRSFTDataModule(path, smollm2_tokenizer, val_split=None, test_split=None, batch_size=8)
    dm.setup("fit")
    ds = dm.dataset("train")
    assert len(ds) == len(sft_rows)
    tok = smollm2_tokenizer
    for ex, row in zip(ds, sft_rows):
        assert len(ex["_prompt_ids"]) <= 512
        _check_d2(ex["prompt"], row)
        assert tok.decode(ex["_prompt_ids"]) == ex["prompt"]
        assert ex["reference"] == " " + row["summary"]
        assert tok.decode(ex["_completion_ids"]) == " " + row["summary"] + tok.eos_token
    long_ex = ds[len(ds) - 1]
    assert long_ex["prompt"] != format_tldr_query(long_row["info"]["subreddit"], long_row["info"]["title"], long_post)
    assert len(tok(format_tldr_query("a", "b", long_post))["input_ids"]) > 512  # it really needed truncating
    # the kept post is the longest paragraph-boundary prefix that fits: cuts one paragraph at a time
    sub, title = long_row["info"]["subreddit"], long_row["info"]["title"]
    cuts = {long_post[:i].rstrip() for i, ch in enumerate(long_post) if ch == "\n"}
    fitting = [c for c in cuts if len(encode_prompt(tok, format_tldr_query(sub, title, c))) <= 512]
    assert long_ex["prompt"] == format_tldr_query(sub, title, max(fitting, key=len))
    assert long_ex["prompt"].count("\n") > 6  # several paragraphs were kept
    assert dm.length_stats["train"]["prompt"]["max"] <= 512


def test_sft_batches_and_reference_texts(tiny_tokenizer, tmp_path):
    rows = [tldr_sft_row(k) for k in range(10)]
    path = write_jsonl(tmp_path / "d" / "train.jsonl", rows)
    write_jsonl(tmp_path / "d" / "validation.jsonl", rows[:4])
    dm = TLDRSFTDataModule(str(tmp_path / "d"), tiny_tokenizer, test_split=None, batch_size=4)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, SFTBatch) and batch.input_ids.shape[0] == 4
    _check_right_padded(batch, tiny_tokenizer)
    for i in range(4):
        row = next(r for r in rows if r["id"] == batch.meta["id"][i])
        assert tiny_tokenizer.decode(batch.input_ids[i][batch.attention_mask[i]]) == (
            format_tldr_query(row["subreddit"], row["title"], row["post"]) + " " + row["summary"] + "</s>")
    prompts, refs = dm.reference_texts("val")
    assert prompts == [format_tldr_query(r["subreddit"], r["title"], r["post"]) for r in rows[:4]]
    assert refs == [format_tldr_completion(r["summary"]) for r in rows[:4]]
    stats = dm.length_stats["train"]
    assert set(stats) == {"prompt", "completion"}
    assert {"min", "mean", "max", "p50", "p90", "p95", "p99"} <= set(stats["prompt"])
    assert stats["completion"]["max"] == max(len(" " + r["summary"]) + 1 for r in rows)
    assert path


def test_train_shuffle_is_seeded(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "sft.jsonl", [tldr_sft_row(k) for k in range(16)])

    def order(seed):
        dm = TLDRSFTDataModule(path, tiny_tokenizer, val_split=None, test_split=None, batch_size=16, seed=seed)
        dm.setup("fit")
        return next(iter(dm.train_dataloader())).meta["id"]

    assert order(3) == order(3)
    assert order(3) != order(4)


def test_prompt_datamodule_left_padded(tiny_tokenizer, tmp_path):
    rows = [tldr_sft_row(k, post="P" * (5 * k + 1)) for k in range(6)]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    dm = TLDRPromptDataModule(path, tiny_tokenizer, train_split=None, val_split="train", test_split=None,
                              eval_batch_size=6)
    dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    assert isinstance(batch, PromptBatch)
    assert batch.attention_mask[:, -1].all() and not batch.attention_mask[0, 0]  # left padded
    for i, row in enumerate(rows):
        n = int(batch.attention_mask[i].sum())
        assert (batch.input_ids[i, :-n] == tiny_tokenizer.pad_token_id).all()
        assert tiny_tokenizer.decode(batch.input_ids[i, -n:]) == batch.meta["prompt"][i]
        assert batch.meta["reference"][i] == " " + row["summary"] and batch.meta["id"][i] == row["id"]
        assert batch.meta["title"][i] == row["title"]
    assert dm.reference_texts("val")[1] == [" " + r["summary"] for r in rows]


def test_works_with_distributed_sampler(tiny_tokenizer):
    """Lightning swaps in a DistributedSampler under DDP; the rebuilt loader must still collate."""
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DistributedSampler

    dm = TLDRSFTDataModule("bundled:tldr_sft", tiny_tokenizer, val_split=None, test_split=None, batch_size=4)
    dm.setup("fit")
    loader = dm.train_dataloader()
    ds = dm.dataset("train")
    ranks = [_update_dataloader(loader, DistributedSampler(ds, num_replicas=2, rank=r, seed=0)) for r in (0, 1)]
    ids = [sum((b.meta["id"] for b in rl), []) for rl in ranks]
    assert len(ids[0]) == len(ids[1]) == len(ds) // 2 and not set(ids[0]) & set(ids[1])
    assert isinstance(next(iter(ranks[0])), SFTBatch)


def test_hub_id_offline_suggests_local_path(tiny_tokenizer):
    dm = TLDRSFTDataModule(tokenizer=tiny_tokenizer)
    with pytest.raises(DataSourceError, match="pass a local path") as err:
        dm.setup("fit")
    assert "vwxyzjn/summarize_from_feedback_tldr_3_filtered" in str(err.value)
    with pytest.raises(DataSourceError, match="does not exist"):
        TLDRPreferenceDataModule("./no/such/file.jsonl", tiny_tokenizer).setup("fit")
