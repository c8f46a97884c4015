"""ChatSFTDataModule: conversations (`messages`) as SFT examples laid out as the chat DataModules
lay out prompts and answers, and bad rows named."""

from __future__ import annotations

import logging

import pytest
import torch

from lit_rlhf.data import BadRowError, ChatSFTDataModule, UltraFeedbackPromptDataModule
from lit_rlhf.types import SFTBatch
from tests.data.conftest import write_jsonl


def sft_row(k: int, answer: str | None = None) -> dict:
    prompt = f"Name a colour number {k}."
    return {"prompt": prompt, "prompt_id": f"id{k}", "messages": [
        {"role": "user", "content": prompt}, {"role": "assistant", "content": answer or f"Colour {k} is blue."}]}


def _batch(dm, split="train", size=3):
    return next(iter(torch.utils.data.DataLoader(dm.dataset(split), batch_size=size, collate_fn=dm._collator(split))))


def test_prompt_and_answer_are_the_templated_conversation(tiny_tokenizer, tmp_path):
    rows = [sft_row(k) for k in range(3)]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    dm = ChatSFTDataModule(path, tiny_tokenizer, train_split="train", val_split=None, batch_size=3)
    dm.setup("fit")
    batch = _batch(dm)
    assert isinstance(batch, SFTBatch) and batch.meta["prompt_id"] == ["id0", "id1", "id2"]
    prompts = UltraFeedbackPromptDataModule(path, tiny_tokenizer, train_split="train", val_split=None)
    prompts.setup("fit")
    for i, row in enumerate(rows):
        ids = batch.input_ids[i][batch.attention_mask[i]]
        p = int(ids.numel() - batch.loss_mask[i].sum())
        # the prompt is exactly what the online DataModule generates from, the loss is on the answer + EOS
        assert ids[:p].tolist() == prompts.dataset("train")[i]["_prompt_ids"]
        assert tiny_tokenizer.decode(batch.input_ids[i][batch.loss_mask[i]]) == row["messages"][-1]["content"] + "<|im_end|></s>"
        assert batch.meta["reference"][i] == row["messages"][-1]["content"] + "<|im_end|>"


def test_bundled_keyfact_chat_answers_are_the_key_facts(smollm2_tokenizer):
    dm = ChatSFTDataModule("bundled:keyfact_chat", smollm2_tokenizer, train_split="train_sft", val_split=None,
                           max_prompt_length=160, max_completion_length=40, batch_size=2)
    dm.setup("fit")
    ds = dm.dataset("train")
    assert len(ds) == 160 and ds[0]["prompt_id"] == "keyfact_0000"
    batch = _batch(dm, size=2)
    answer = smollm2_tokenizer.decode(batch.input_ids[0][batch.loss_mask[0]])
    assert answer == ds[0]["reference"] + smollm2_tokenizer.eos_token


@pytest.mark.parametrize("mode", ["error", "skip"])
def test_a_conversation_without_an_answer_is_named(mode, tiny_tokenizer, tmp_path, caplog):
    rows = [sft_row(0), sft_row(1), {**sft_row(2), "messages": [{"role": "user", "content": "hi"},
                                                                 {"role": "assistant", "content": ""}]}]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    dm = ChatSFTDataModule(path, tiny_tokenizer, train_split="train", val_split=None, on_bad_rows=mode)
    if mode == "error":
        with pytest.raises(BadRowError) as err:
            dm.setup("fit")
        msg = str(err.value)
        assert path in msg and "split 'train'" in msg and "row 2" in msg and "messages[1].content" in msg, msg
        return
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.data"):
        dm.setup("fit")
    assert len(dm.dataset("train")) == 2 and sum(dm.skipped_rows.values()) == 1
