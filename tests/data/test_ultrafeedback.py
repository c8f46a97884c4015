"""UltraFeedback DataModules on rows built in the published schemas."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_rlhf.data import (
    NoChatTemplateError,
    UltraFeedbackPreferenceDataModule,
    UltraFeedbackPromptDataModule,
    UltraFeedbackSingleDataModule,
)
from lit_rlhf.types import PreferenceBatch, PromptBatch, SingleBatch
from tests.data.conftest import binarized_row, openbmb_row, write_jsonl

TRAIN_SCORES = [[9.0, 7.0, 3.0, 1.0], [8.0, 8.5, 2.0, 6.0], [10.0, 4.0, 5.0, 2.5]]
VAL_SCORES = [[6.0, 1.0, 9.5, 3.0]]


def _all(loader) -> list:
    return list(loader)


@pytest.fixture()
def openbmb_files(tmp_path):
    train = write_jsonl(tmp_path / "uf" / "train.jsonl", [openbmb_row(k, s) for k, s in enumerate(TRAIN_SCORES)])
    write_jsonl(tmp_path / "uf" / "validation.jsonl", [openbmb_row(10 + k, s) for k, s in enumerate(VAL_SCORES)])
    return str(tmp_path / "uf"), train


def test_reward_normalisation_uses_train_statistics(tiny_tokenizer, openbmb_files):
    path, _ = openbmb_files
    dm = UltraFeedbackSingleDataModule(path, tiny_tokenizer, val_split="validation", batch_size=5)
    dm.setup("fit")
    raw_train = torch.tensor(sum(TRAIN_SCORES, []), dtype=torch.float64)
    mean, std = raw_train.mean().item(), raw_train.std(correction=0).item()
    assert dm.reward_stats == pytest.approx({"field": "overall_score", "mean": mean, "std": std, "count": 12})

    train = _all(dm.train_dataloader())
    assert all(isinstance(b, SingleBatch) and b.labels is None for b in train)
    r = torch.cat([b.rewards for b in train]).double()
    assert r.numel() == 12 and abs(r.mean().item()) < 1e-6 and abs(r.var(correction=0).item() - 1) < 1e-6

    val = _all(dm.val_dataloader())
    got = torch.cat([b.rewards for b in val]).double()
    expected = (torch.tensor(VAL_SCORES[0], dtype=torch.float64) - mean) / std  # the train statistics
    assert torch.allclose(got, expected, atol=1e-6)
    assert [b for b in val][0].meta["completion_index"] == [0, 1, 2, 3]

    # a checkpoint carries the statistics: restored ones win over the new data's own
    restored = UltraFeedbackSingleDataModule(path, tiny_tokenizer, train_split="validation", val_split="validation")
    restored.load_state_dict(dm.state_dict())
    restored.setup("fit")
    assert restored.reward_stats == dm.reward_stats
    got = torch.cat([b.rewards for b in restored.val_dataloader()]).double()
    assert torch.allclose(got, expected, atol=1e-6)


def test_reward_field_and_labels(tiny_tokenizer, openbmb_files):
    path, _ = openbmb_files
    dm = UltraFeedbackSingleDataModule(path, tiny_tokenizer, reward_field="fine-grained_score",
                                       label_mode="threshold", label_threshold=3.0, batch_size=12)
    dm.setup("fit")
    assert dm.reward_stats["mean"] == pytest.approx(sum(sum(TRAIN_SCORES, [])) / 2 / 12)
    ds = dm.dataset("train")
    b = next(iter(torch.utils.data.DataLoader(ds, batch_size=12, collate_fn=dm._collator("train"))))
    assert b.labels.tolist() == [s / 2 > 3.0 for s in sum(TRAIN_SCORES, [])]

    pairs = UltraFeedbackSingleDataModule(path, tiny_tokenizer, label_mode="pairs", with_rewards=False)
    pairs.setup("fit")
    ds = pairs.dataset("train")
    assert list(ds["completion_index"]) == [0, 3, 1, 2, 0, 3]  # best then worst of each prompt
    b = next(iter(torch.utils.data.DataLoader(ds, batch_size=6, collate_fn=pairs._collator("train"))))
    assert b.labels.tolist() == [True, False] * 3 and b.rewards is None


def test_single_chat_formatting_decodes_to_template(tiny_tokenizer, openbmb_files):
    path, _ = openbmb_files
    dm = UltraFeedbackSingleDataModule(path, tiny_tokenizer, batch_size=4)
    dm.setup("fit")
    b = next(iter(torch.utils.data.DataLoader(dm.dataset("train"), batch_size=4, collate_fn=dm._collator("train"))))
    row = openbmb_row(0, TRAIN_SCORES[0])
    for i, c in enumerate(row["completions"]):
        messages = [{"role": "user", "content": row["instruction"]}, {"role": "assistant", "content": c["response"]}]
        full = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
        assert tiny_tokenizer.decode(b.input_ids[i][b.attention_mask[i]]) == full.rstrip() + tiny_tokenizer.eos_token
        assert tiny_tokenizer.decode(b.input_ids[i][b.loss_mask[i]]) == c["response"] + "<|im_end|></s>"
        assert b.meta["model"][i] == c["model"] and b.meta["raw_prompt"][i] == row["instruction"]
        assert b.meta["completion"][i] == c["response"] + "<|im_end|>"  # the template's continuation, no EOS


def test_preference_pairs_with_smollm2_template(smollm2_tokenizer, tmp_path):
    """SmolLM2 ends a turn with its EOS <|im_end|>: prompt + completion is exactly the templated text."""
    rows = [binarized_row(k, score_chosen=9.0, score_rejected=9.0 - k) for k in range(1, 4)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    dm = UltraFeedbackPreferenceDataModule(path, smollm2_tokenizer, train_split="train", val_split=None,
                                           margin_from="score_difference", batch_size=3)
    dm.setup("fit")
    loader = torch.utils.data.DataLoader(dm.dataset("train"), batch_size=3, collate_fn=dm._collator("train"))
    batch = next(iter(loader))
    assert isinstance(batch, PreferenceBatch) and batch.margin.tolist() == [1.0, 2.0, 3.0]
    tok = smollm2_tokenizer
    for i, row in enumerate(rows):
        for r, conv in ((i, row["chosen"]), (3 + i, row["rejected"])):
            full = tok.apply_chat_template(conv, tokenize=False)
            assert full.endswith(tok.eos_token + "\n")
            ids = batch.input_ids[r][batch.attention_mask[r]]
            assert ids.tolist() == tok(full[: -len("\n")], add_special_tokens=False)["input_ids"]
            p = int(batch.prompt_lengths[r])
            assert tok.decode(ids[:p]) == tok.apply_chat_template(conv[:-1], tokenize=False, add_generation_prompt=True)
            assert tok.decode(batch.input_ids[r][batch.loss_mask[r]]) == conv[-1]["content"] + tok.eos_token


def test_preference_tiny_and_meta(tiny_tokenizer, tmp_path):
    rows = [binarized_row(k) for k in range(4)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    dm = UltraFeedbackPreferenceDataModule(path, tiny_tokenizer, train_split="train", val_split=None, batch_size=4)
    dm.setup("fit")
    batch = next(iter(torch.utils.data.DataLoader(dm.dataset("train"), batch_size=4, collate_fn=dm._collator("train"))))
    assert batch.margin is None and batch.meta["prompt_id"] == [r["prompt_id"] for r in rows]
    assert batch.meta["raw_prompt"] == [r["prompt"] for r in rows]
    for i, row in enumerate(rows):
        assert tiny_tokenizer.decode(batch.input_ids[i][batch.loss_mask[i]]) == (
            row["chosen"][-1]["content"] + "<|im_end|></s>")
        assert tiny_tokenizer.decode(batch.input_ids[4 + i][batch.loss_mask[4 + i]]) == (
            row["rejected"][-1]["content"] + "<|im_end|></s>")


def test_no_chat_template_is_a_clear_error(tiny_tokenizer, tmp_path):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = None
    path = write_jsonl(tmp_path / "p.jsonl", [binarized_row(0), binarized_row(1)])
    for cls in (UltraFeedbackPreferenceDataModule, UltraFeedbackPromptDataModule):
        dm = cls(path, tok, train_split="train", val_split=None)
        with pytest.raises(NoChatTemplateError, match="no chat template"):
            dm.setup("fit")


def test_prompt_datamodule_both_schemas(tiny_tokenizer, tmp_path, openbmb_files):
    rows = [binarized_row(k) for k in range(3)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    dm = UltraFeedbackPromptDataModule(path, tiny_tokenizer, train_split="train", val_split=None, batch_size=3)
    dm.setup("fit")
    b = next(iter(torch.utils.data.DataLoader(dm.dataset("train"), batch_size=3, collate_fn=dm._collator("train"))))
    assert isinstance(b, PromptBatch) and b.attention_mask[:, -1].all()
    for i, row in enumerate(rows):
        n = int(b.attention_mask[i].sum())
        expected = tiny_tokenizer.apply_chat_template(row["chosen"][:-1], tokenize=False, add_generation_prompt=True)
        assert tiny_tokenizer.decode(b.input_ids[i, -n:]) == expected == b.meta["prompt"][i]
        assert b.meta["reference"][i] == row["chosen"][-1]["content"] + "<|im_end|>"
        assert b.meta["prompt_id"][i] == row["prompt_id"]
    uf_path, _ = openbmb_files
    dm = UltraFeedbackPromptDataModule(uf_path, tiny_tokenizer, train_split="train", val_split=None)
    dm.setup("fit")
    ex = dm.dataset("train")[0]
    assert ex["raw_prompt"] == "Count to 0." and ex["reference"] is None and ex["source"] == "test"
