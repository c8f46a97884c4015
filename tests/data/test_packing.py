"""Padding-free packing of SFT batches: the bins, the packed layout, unpacking, padding waste."""

from __future__ import annotations

import random

import pytest
import torch

from lit_rlhf.data import TLDRSFTDataModule
from lit_rlhf.data.collate import SFTCollator
from lit_rlhf.data.packing import PackedSFTCollator, first_fit_decreasing, pack_sequences
from lit_rlhf.types import padding_fraction, unpack
from lit_rlhf.types import PackedSFTBatch, Rollout, SFTBatch

PAD, EOS = 0, 9


def _ex(prompt, completion, row=0):
    return {"_prompt_ids": prompt, "_completion_ids": completion, "_row": row, "prompt": f"p{row}"}


def test_first_fit_decreasing_respects_the_budget():
    lengths = [5, 3, 4, 2, 2, 9]
    bins = first_fit_decreasing(lengths, 6)
    assert sorted(i for b in bins for i in b) == list(range(6))  # every example once
    assert [9] in [[lengths[i] for i in b] for b in bins]  # longer than the budget: a row of its own
    assert all(sum(lengths[i] for i in b) <= 6 for b in bins if b != [5])
    # longest first, each into the first bin with room: 9 alone | 5 | 4+2 | 3+2
    assert bins == [[5], [0], [2, 3], [1, 4]]
    assert first_fit_decreasing(lengths, None) == [list(range(6))]
    assert first_fit_decreasing([], 4) == []
    with pytest.raises(ValueError, match="pack_length"):
        first_fit_decreasing(lengths, 0)


def test_packed_layout_by_hand():
    prompts, completions = [[1, 2], [3]], [[4, EOS], [5, 6, EOS]]
    ids, pos, attn, loss, rows, starts, lengths = pack_sequences(prompts, completions, PAD)
    assert ids.tolist() == [[1, 2, 4, EOS, 3, 5, 6, EOS]]
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert attn.all()
    assert loss.tolist() == [[False, False, True, True, False, True, True, True]]
    assert rows.tolist() == [0, 0] and starts.tolist() == [0, 4] and lengths.tolist() == [4, 4]

    # a budget of 5 tokens: one example per row, the shorter row PAD-filled; its tail restarts at 0
    ids, pos, attn, loss, rows, starts, lengths = pack_sequences([[1, 2], [3]], [[4, EOS], [6, EOS]], PAD, 5)
    assert ids.tolist() == [[1, 2, 4, EOS], [3, 6, EOS, PAD]]
    assert pos.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0]]
    assert attn.tolist() == [[True] * 4, [True, True, True, False]]
    assert rows.tolist() == [0, 1] and starts.tolist() == [0, 0]
    with pytest.raises(ValueError, match="empty example"):
        pack_sequences([[]], [[]], PAD)


@pytest.mark.parametrize("pack_length", [None, 1, 12, 25])
def test_unpack_gives_the_padded_batch(pack_length):
    rnd = random.Random(pack_length or 0)
    examples = [_ex([rnd.randrange(1, 9) for _ in range(rnd.randrange(1, 8))],
                    [rnd.randrange(1, 9) for _ in range(rnd.randrange(0, 5))] + [EOS], row=i) for i in range(7)]
    packed = PackedSFTCollator(PAD, pack_length)(examples)
    padded = SFTCollator(PAD)(examples)
    assert isinstance(packed, PackedSFTBatch) and packed.num_examples == 7
    if pack_length is not None:
        assert int(packed.attention_mask.sum(1).max()) <= max(pack_length, int(packed.example_lengths.max()))
    assert packed.meta == padded.meta and packed.meta["index"] == list(range(7))
    assert int(packed.loss_mask.sum()) == int(padded.loss_mask.sum())
    assert int(packed.attention_mask.sum()) == int(padded.attention_mask.sum())
    back = unpack(packed, PAD)
    assert isinstance(back, SFTBatch)
    for a, b in zip(back[:3], padded[:3]):
        assert torch.equal(a, b)


def test_padding_fraction():
    examples = [_ex([1, 2, 3], [4, EOS]), _ex([1], [EOS])]  # 5 + 2 tokens
    assert padding_fraction(SFTCollator(PAD)(examples)) == pytest.approx(1 - 7 / 10)
    assert padding_fraction(PackedSFTCollator(PAD)(examples)) == 0.0
    assert padding_fraction(PackedSFTCollator(PAD, 5)(examples)) == pytest.approx(1 - 7 / 10)  # rows of 5 and 2
    assert padding_fraction(object()) is None
    rollout = Rollout(prompt_ids=torch.zeros(2, 3, dtype=torch.long),
                      prompt_mask=torch.tensor([[False, True, True], [True, True, True]]),
                      response_ids=torch.zeros(2, 2, dtype=torch.long),
                      response_attention_mask=torch.tensor([[True, False], [True, True]]), has_eos=torch.ones(2, dtype=torch.bool),
                      logps=None)
    assert padding_fraction(rollout) == pytest.approx(2 / 10)  # prompt and response padding both count


def test_datamodule_packs_the_same_examples_per_batch(tiny_tokenizer):
    kwargs = dict(path="bundled:tldr_sft", tokenizer=tiny_tokenizer, max_prompt_length=96, max_completion_length=256,
                  limit=12, batch_size=4, val_split=None, test_split=None)
    padded, packed = TLDRSFTDataModule(**kwargs), TLDRSFTDataModule(packing=True, pack_length=300, **kwargs)
    assert packed.batch_type() is PackedSFTBatch and padded.batch_type() is SFTBatch
    batches = rows = padded_slots = packed_slots = 0
    for a, b in zip(padded.train_dataloader(), packed.train_dataloader(), strict=True):
        assert isinstance(b, PackedSFTBatch) and b.input_ids.shape[1] <= 300
        assert a.meta["index"] == b.meta["index"]  # the same examples, in the same order
        assert int(a.loss_mask.sum()) == int(b.loss_mask.sum())
        assert int(a.attention_mask.sum()) == int(b.attention_mask.sum())  # the same real tokens
        batches, rows = batches + 1, rows + a.input_ids.shape[0]
        padded_slots, packed_slots = padded_slots + a.attention_mask.numel(), packed_slots + b.attention_mask.numel()
    assert (batches, rows) == (3, 12) and packed_slots < padded_slots  # packing leaves less padding
    with pytest.raises(ValueError, match="pack_length"):
        TLDRSFTDataModule(packing=True, pack_length=0, **kwargs)
