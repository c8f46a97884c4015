"""The bundled synthetic datasets: reproducible, loadable by alias, clean, and CLI-configurable."""

from __future__ import annotations

import filecmp
import importlib.util

import pytest

from lit_rlhf.data import (
    DataSourceError,
    TLDRPreferenceDataModule,
    TLDRPromptDataModule,
    TLDRSFTDataModule,
    UltraFeedbackPreferenceDataModule,
    UltraFeedbackPromptDataModule,
    UltraFeedbackSingleDataModule,
    bundled_aliases,
)
from lit_rlhf.data.sources import BUNDLED_DIR
from lit_rlhf.types import PreferenceBatch, PromptBatch, SFTBatch, SingleBatch


def test_bundled_files_are_what_the_script_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_bundled", BUNDLED_DIR / "make_bundled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    spec = importlib.util.spec_from_file_location("make_arithmetic", BUNDLED_DIR / "make_arithmetic.py")
    arithmetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arithmetic)
    arithmetic.main(tmp_path)
    spec = importlib.util.spec_from_file_location("make_keyfact", BUNDLED_DIR / "make_keyfact.py")
    keyfact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(keyfact)
    keyfact.main(tmp_path)
    spec = importlib.util.spec_from_file_location("make_keyfact_chat", BUNDLED_DIR / "make_keyfact_chat.py")
    keyfact_chat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(keyfact_chat)
    keyfact_chat.write_sft(tmp_path)  # its pairs are sampled from SmolLM2 once: the committed files are the record
    written = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    sampled = {f"keyfact_chat.{split}_prefs.jsonl" for split in keyfact_chat.PREF_SPLITS}
    assert written == sorted(p.name for p in BUNDLED_DIR.glob("*.jsonl") if p.name not in sampled)
    for name in written:
        assert filecmp.cmp(tmp_path / name, BUNDLED_DIR / name, shallow=False), name


def test_aliases():
    table = bundled_aliases()
    assert set(table) == {"tldr_sft", "tldr_comparisons", "ultrafeedback_binarized", "ultrafeedback", "arithmetic",
                          "keyfact_sft", "keyfact_comparisons", "keyfact_chat", "keyfact_checks"}
    assert set(table["tldr_sft"]) == {"train", "validation", "test"}
    assert set(table["ultrafeedback_binarized"]) == {"train_prefs", "test_prefs"}
    with pytest.raises(DataSourceError, match="unknown bundled dataset"):
        TLDRSFTDataModule("bundled:nope", "tiny-random-llama").setup("fit")


@pytest.mark.parametrize(
    "cls,path,kwargs,batch_type",
    [
        (TLDRSFTDataModule, "bundled:tldr_sft", {}, SFTBatch),
        (TLDRPromptDataModule, "bundled:tldr_sft", {}, PromptBatch),
        (TLDRPreferenceDataModule, "bundled:tldr_comparisons", {"margin_from": "confidence"}, PreferenceBatch),
        (TLDRPromptDataModule, "bundled:keyfact_sft", {}, PromptBatch),
        (TLDRPreferenceDataModule, "bundled:keyfact_comparisons", {"val_split": "test"}, PreferenceBatch),
        (UltraFeedbackPreferenceDataModule, "bundled:ultrafeedback_binarized", {}, PreferenceBatch),
        (UltraFeedbackPromptDataModule, "bundled:ultrafeedback_binarized", {}, PromptBatch),
        (UltraFeedbackPreferenceDataModule, "bundled:keyfact_chat", {"train_split": "train_prefs",
                                                                       "val_split": "test_prefs"}, PreferenceBatch),
        (UltraFeedbackPromptDataModule, "bundled:keyfact_chat", {"train_split": "train_sft", "val_split": "test_sft"},
         PromptBatch),
        (UltraFeedbackSingleDataModule, "bundled:ultrafeedback",
         {"train_split": "train[:75%]", "val_split": "train[75%:]", "label_mode": "threshold"}, SingleBatch),
    ],
)
def test_bundled_loads_clean_with_tiny_tokenizer(cls, path, kwargs, batch_type):
    # the tokenizer given by name, as the CLI does; default lengths except a 256-token prompt budget
    if "keyfact_chat" in path:  # the tiny tokenizer is byte-level: a chat post takes ~330 tokens
        kwargs = {**kwargs, "max_prompt_length": 512}
        if cls is UltraFeedbackPreferenceDataModule:
            kwargs["max_completion_length"] = 256
    dm = cls(path, "tiny-random-llama", **{"max_prompt_length": 256, **kwargs}, on_bad_rows="error", batch_size=4)
    dm.setup("fit")
    assert not dm.skipped_rows and len(dm.dataset("train")) >= 24 and len(dm.dataset("val")) >= 8
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, batch_type)
    assert batch.input_ids.shape[1] <= dm.max_prompt_length + getattr(dm, "max_completion_length", 64)
    assert dm.hparams["tokenizer"] == "tiny-random-llama" and dm.hparams["path"] == path


def test_bundled_preference_is_learnable_signal():
    """The preferred TL;DR summary is the specific one, whichever position it is in."""
    dm = TLDRPreferenceDataModule("bundled:tldr_comparisons", "tiny-random-llama", val_split=None)
    dm.setup("fit")
    ds = dm.dataset("train")
    assert set(ds["chosen_policy"]) == {"writer_specific"} and set(ds["rejected_policy"]) == {"writer_vague"}


def test_constructor_signatures_parse_with_jsonargparse():
    from jsonargparse import ArgumentParser

    for cls in (TLDRSFTDataModule, TLDRPromptDataModule, TLDRPreferenceDataModule, UltraFeedbackPreferenceDataModule,
                UltraFeedbackSingleDataModule, UltraFeedbackPromptDataModule):
        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(cls, "data")
        cfg = parser.parse_args(["--data.path=bundled:tldr_sft", "--data.tokenizer=tiny-random-llama",
                                 "--data.on_bad_rows=skip", "--data.limit=4", '--data.split_map={"a": "b"}'])
        assert cfg.data.on_bad_rows == "skip" and cfg.data.limit == 4 and cfg.data.split_map == {"a": "b"}


def test_keyfact_pairs_are_noisy_graded_and_length_matched():
    """The main job's preference data is not separable by construction: labels follow the gold
    through Bradley-Terry noise, and a length cue cannot split the pairs."""
    import json

    from lit_rlhf.judges.keyfact import keyfact_recall_v1 as keyfact_recall  # the gold of generation time

    for split in ("train", "test"):
        rows = [json.loads(line) for line in (BUNDLED_DIR / f"keyfact_comparisons.{split}.jsonl").open()]
        posts = {json.loads(line)["post"]: json.loads(line)["summary"]
                 for s in ("train", "validation", "test") for line in (BUNDLED_DIR / f"keyfact_sft.{s}.jsonl").open()}
        agree = longer = 0
        for row in rows:
            texts = [s["text"] for s in row["summaries"]]
            golds = [keyfact_recall(t, posts[row["info"]["post"]]) for t in texts]
            assert [f"gold={g:.3f}" for g in golds] == [s["note"] for s in row["summaries"]]
            assert golds[0] != golds[1]
            assert len(texts[0].split()) == len(texts[1].split())
            agree += golds[row["choice"]] > golds[1 - row["choice"]]
            longer += len(texts[row["choice"]].split()) > len(texts[1 - row["choice"]].split())
        assert 0.8 <= agree / len(rows) <= 0.97, agree / len(rows)  # noisy, but mostly right
        assert longer / len(rows) < 0.6, longer / len(rows)
    held_out = {json.loads(line)["title"] for line in (BUNDLED_DIR / "keyfact_sft.test.jsonl").open()}
    trained = {json.loads(line)["title"] for line in (BUNDLED_DIR / "keyfact_sft.train.jsonl").open()}
    assert len(held_out) == 64 and not held_out & trained  # held-out posts are new person x situation pairs


def test_keyfact_chat_pairs_are_the_policy_answers_labelled_by_a_noisy_gold():
    """The main job's reward-model data: pairs of distinct answers to the same held-in or held-out
    post, whose scores are the gold key-fact recall of each answer, labelled through noise (some
    labels go against the gold, near-ties are coin flips), never from the other split's posts."""
    import json

    from lit_rlhf.judges.keyfact import keyfact_recall_v1 as keyfact_recall  # the gold of generation time

    posts = {split: {json.loads(line)["id"]: json.loads(line) for line in open(BUNDLED_DIR / f"keyfact_sft.{split}.jsonl")}
             for split in ("train", "test")}
    for split in ("train", "test"):
        rows = [json.loads(line) for line in open(BUNDLED_DIR / f"keyfact_chat.{split}_prefs.jsonl")]
        assert len(rows) >= 70
        against = 0
        for row in rows:
            post = posts[split][row["prompt_id"]]
            assert post["post"] in row["prompt"] and row["chosen"][0] == row["rejected"][0]
            chosen, rejected = row["chosen"][-1]["content"], row["rejected"][-1]["content"]
            assert chosen != rejected and row["messages"] == row["chosen"]
            assert row["score_chosen"] == round(keyfact_recall(chosen, post["summary"]), 4)
            assert row["score_rejected"] == round(keyfact_recall(rejected, post["summary"]), 4)
            against += row["score_chosen"] < row["score_rejected"]
        decided = sum(r["score_chosen"] != r["score_rejected"] for r in rows)
        assert 0 < against < 0.25 * decided  # noisy, but mostly with the gold


def test_the_fixed_gold_reorders_some_chat_pairs_and_reverses_none():
    """The bundled pairs keep the labels of their generation-time gold (`keyfact_recall_v1`); under
    the fixed gold (`keyfact_recall`: contractions expanded, Porter's light stemmer) 49 of the 216
    training pairs have an answer whose gold changed, 11 change order (a tie becomes decided or
    the reverse) and none is reversed (the README's reading states these counts)."""
    import json

    from lit_rlhf.judges.keyfact import keyfact_recall, keyfact_recall_v1

    def order(gold, a, b, ref):
        return (gold(a, ref) > gold(b, ref)) - (gold(a, ref) < gold(b, ref))

    posts = {json.loads(line)["id"]: json.loads(line)["summary"] for line in open(BUNDLED_DIR / "keyfact_sft.train.jsonl")}
    rows = [json.loads(line) for line in open(BUNDLED_DIR / "keyfact_chat.train_prefs.jsonl")]
    changed = reordered = reversed_ = 0
    for row in rows:
        ref, a, b = posts[row["prompt_id"]], row["chosen"][-1]["content"], row["rejected"][-1]["content"]
        changed += any(keyfact_recall(x, ref) != keyfact_recall_v1(x, ref) for x in (a, b))
        old, new = order(keyfact_recall_v1, a, b, ref), order(keyfact_recall, a, b, ref)
        reordered += old != new
        reversed_ += old * new < 0
    assert (len(rows), changed, reordered, reversed_) == (216, 49, 11, 0)


def test_keyfact_checks_hold_each_post_and_never_flag_its_own_true_texts():
    """Every post has its checks; no listed false claim matches the post's key fact, title or any
    sentence of the post (a pattern that did would mark true answers false), and the listed
    distractors are the ones the post names."""
    import json
    import re

    from lit_rlhf.judges.keyfact import listed_matches

    for split in ("train", "validation", "test"):
        posts = [json.loads(line) for line in open(BUNDLED_DIR / f"keyfact_sft.{split}.jsonl")]
        checks = [json.loads(line) for line in open(BUNDLED_DIR / f"keyfact_checks.{split}.jsonl")]
        assert [(c["id"], c["title"], c["post"], c["summary"]) for c in checks] == \
            [(p["id"], p["title"], p["post"], p["summary"]) for p in posts]
        for c in checks:
            assert len(c["false_claims"]) >= 2 and len(c["distractors"]) == 3
            for text in [c["summary"], c["title"], *re.split(r"(?<=[.!?])\s+", c["post"])]:
                assert listed_matches(text, c["false_claims"]) == [], (text, c["false_claims"])
            assert listed_matches(c["post"], c["distractors"]) == c["distractors"]
            assert listed_matches(c["summary"], c["distractors"]) == []


@pytest.mark.parametrize("answer,false", [
    # answers the trained policies gave (results/quickstart/seed1.json, seed4.json), and true ones
    ("Your sister has two weeks to move out and has no other plans to leave Toronto.", True),
    ("Your sister has agreed to move out of the house", True),
    ("My sister gave me two weeks to move out.", False),
    ("Your sister wants you to move out in two weeks.", False),
])
def test_keyfact_checks_mark_an_inverted_move_out(answer, false):
    import json

    from lit_rlhf.judges.keyfact import listed_matches

    rows = [json.loads(line) for s in ("train", "validation", "test") for line in open(BUNDLED_DIR / f"keyfact_checks.{s}.jsonl")]
    row = next(r for r in rows if r["summary"] == "Sister gave me two weeks to move out.")
    assert bool(listed_matches(answer, row["false_claims"])) is false
