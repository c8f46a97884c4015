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


def _comparison(k: int, text_a: str | None = None, **info) -> dict:
    return {"info": {"id": f"t3_{k}", "post": f"Post {k}.\n\nMore.", "title": f"Title {k}", "subreddit": "s", **info},
            "split": "valid1", "summaries": [{"text": text_a or f" Good {k}.", "policy": "a", "note": ""},
                                             {"text": f" Bad {k}.", "policy": "b", "note": ""}],
            "choice": 0, "worker": "w", "batch": "batch1", "extra": {"confidence": 5}}


def _cnndm(k: int, article: str) -> dict:
    row = _comparison(k)
    row["info"] = {"id": f"cnn_{k}", "article": article, "site": "cnn", "title": None, "post": None,
                   "subreddit": None}
    row["batch"] = "cnndm0"
    return row


def test_preference_completions_up_to_169_tokens_longer_ones_truncated(tiny_tokenizer, tmp_path, caplog):
    """N+ Detail 4: preference completions keep up to 169 tokens (EOS included); a longer one is cut
    to 168 + EOS, counted and logged; the SFT cap stays 53."""
    long_text = " " + "x" * 300  # the tiny tokenizer is byte level: 301 tokens
    rows = [_comparison(0, " " + "y" * 150), _comparison(1, long_text), _comparison(2)]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    dm = TLDRPreferenceDataModule(path, tiny_tokenizer, val_split=None)
    assert dm.max_completion_length == 169 and dm.truncate_completions
    with caplog.at_level("WARNING", logger="lit_rlhf.data"):
        dm.setup("fit")
    ds = dm.dataset("train")
    assert len(ds) == 3 and not dm.skipped_rows
    assert len(ds[0]["_chosen_ids"]) == 152  # 151 bytes + EOS: untouched
    ids = ds[1]["_chosen_ids"]
    assert len(ids) == 169 and ids[-1] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.decode(ids[:-1]) == long_text[:168]
    assert dm.truncated_completions == {"train": 1}
    assert any("1 completion(s) longer than max_completion_length were truncated" in r.getMessage()
               for r in caplog.records)
    assert TLDRSFTDataModule(path, tiny_tokenizer).max_completion_length == 53
    strict = TLDRPreferenceDataModule(path, tiny_tokenizer, val_split=None, truncate_completions=False,
                                      on_bad_rows="skip")
    strict.setup("fit")
    assert len(strict.dataset("train")) == 2 and strict.bad_rows[0]["location"] == "line 2"


def test_cnndm_rows_get_their_query_and_their_own_split(tiny_tokenizer, tmp_path):
    from lit_rlhf.data.formatting import format_cnndm_query

    long_article = "\n".join(f"Paragraph {i} " + "z" * 60 for i in range(40))  # ~2.9k byte tokens
    rows = [_comparison(0), _cnndm(1, "A short article.\nSecond line."), _comparison(2), _cnndm(3, long_article)]
    path = write_jsonl(tmp_path / "v.jsonl", rows)
    dm = TLDRPreferenceDataModule(path, tiny_tokenizer, train_split=None, val_split="validation",
                                  split_map={"validation": "train"}, eval_batch_size=2)
    dm.setup("validate")
    ds = dm.dataset("val")
    assert list(ds["_row"]) == [0, 2, 1, 3]  # TL;DR pairs first, then CNN/DM
    assert list(ds["eval_split"]) == ["validation", "validation", "validation_cnndm", "validation_cnndm"]
    assert dm.eval_split_names("val") == ["validation", "validation_cnndm"] and dm.cnndm_rows["val"] == 2
    assert ds[2]["prompt"] == format_cnndm_query("A short article.\nSecond line.")
    cut = ds[3]
    assert cut["prompt"].startswith("Article:\nParagraph 0 ") and cut["prompt"].endswith("\n\nTL;DR:\n")
    assert len(cut["_prompt_ids"]) <= 1919 < len(tiny_tokenizer(format_cnndm_query(long_article))["input_ids"])
    assert cut["prompt"][len("Article:\n"):-len("\n\nTL;DR:\n")] in long_article  # cut at a newline
    batches = list(dm.val_dataloader())
    assert [b.meta["eval_split"] for b in batches] == [["validation"] * 2, ["validation_cnndm"] * 2]
    # without a CNN/DM split they are formatted alike and evaluated with the rest
    dm = TLDRPreferenceDataModule(path, tiny_tokenizer, train_split=None, val_split="validation",
                                  split_map={"validation": "train"}, cnndm_split=None)
    dm.setup("validate")
    assert list(dm.dataset("val")["_row"]) == [0, 1, 2, 3] and dm.eval_split_names() == ["validation"]
    assert dm.dataset("val")[1]["prompt"].startswith("Article:\n")


def test_reward_module_logs_accuracy_per_eval_split(tiny_tokenizer, tmp_path):
    from lit_rlhf.modules import RewardModule

    rows = [_comparison(0), _cnndm(1, "A short article."), _comparison(2), _cnndm(3, "Another article.")]
    path = write_jsonl(tmp_path / "v.jsonl", rows)
    dm = TLDRPreferenceDataModule(path, tiny_tokenizer, train_split=None, val_split="validation",
                                  split_map={"validation": "train"}, eval_batch_size=4)
    dm.setup("validate")
    module = RewardModule(model="tiny-random-llama").eval()
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, value)
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        module._eval_step(batch, "val")
        chosen, rejected = module.pair_rewards(batch)
    module._log_records("val")
    correct = (chosen > rejected).tolist()
    assert float(logged["val/validation/accuracy"]) == pytest.approx(sum(correct[:2]) / 2)
    assert float(logged["val/validation_cnndm/accuracy"]) == pytest.approx(sum(correct[2:]) / 2)
    assert not any("accuracy_by_eval_split" in k for k in logged)
