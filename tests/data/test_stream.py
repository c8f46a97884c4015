"""The batch stream (`lit_rlhf.data.stream`): every row once per pass, a new order each pass,
ranks dealt disjoint batches, the same rows for the same batch number whatever the global random
state; and a DataModule built from its `{class_path, init_args}` with the module's tokenizer."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.data import TLDRSFTDataModule
from lit_rlhf.data.stream import BatchStream, stream_rows
from lit_rlhf.types import SFTBatch

SFT = {"class_path": "lit_rlhf.data.TLDRSFTDataModule",
       "init_args": {"path": "bundled:tldr_sft", "batch_size": 2, "max_prompt_length": 96, "max_completion_length": 256,
                     "limit": 5}}


def test_each_pass_reads_every_row_once_in_a_new_order():
    # 5 rows, batches of 2: batch 2 straddles passes 0 and 1
    rows = sum((stream_rows(5, 2, k, seed=3) for k in range(5)), [])  # 10 positions = 2 passes
    first, second = rows[:5], rows[5:]
    assert sorted(first) == sorted(second) == list(range(5))
    assert first == torch.randperm(5, generator=torch.Generator().manual_seed(3)).tolist()
    assert second == torch.randperm(5, generator=torch.Generator().manual_seed(4)).tolist()
    assert stream_rows(5, 2, 2, seed=3) == [first[4], second[0]]


def test_ranks_get_disjoint_batches_and_the_global_random_state_is_not_used():
    torch.manual_seed(0)
    a = [stream_rows(8, 2, k, seed=1, rank=r, world_size=2) for k in range(2) for r in range(2)]
    torch.manual_seed(123)
    b = [stream_rows(8, 2, k, seed=1, rank=r, world_size=2) for k in range(2) for r in range(2)]
    assert a == b and sorted(sum(a, [])) == list(range(8))  # one pass dealt out: batch k of rank r in turn
    assert a[1] == stream_rows(8, 2, 1, seed=1)  # rank 1's batch 0 is the single-rank stream's batch 1
    with pytest.raises(ValueError, match="rank"):
        stream_rows(8, 2, 0, rank=2, world_size=2)


def test_batch_stream_collates_the_datamodule_rows(tiny_tokenizer):
    stream = BatchStream.from_spec(SFT, tiny_tokenizer, "ptx_data")
    assert isinstance(stream.datamodule, TLDRSFTDataModule) and stream.datamodule.tokenizer is tiny_tokenizer
    batch = stream.batch(1)
    assert isinstance(batch, SFTBatch) and batch.input_ids.shape[0] == 2
    dataset = stream.datamodule.dataset("train")
    expected = [dataset[i]["id"] for i in stream_rows(len(dataset), 2, 1)]
    assert batch.meta["id"] == expected


def test_batch_stream_refuses_a_bad_spec(tiny_tokenizer):
    with pytest.raises(ValueError, match="ptx_data must be"):
        BatchStream.from_spec("bundled:tldr_sft", tiny_tokenizer, "ptx_data")
    with pytest.raises(ValueError, match="ptx_data.init_args.tokenizer"):
        BatchStream.from_spec({**SFT, "init_args": {**SFT["init_args"], "tokenizer": "gpt2"}}, tiny_tokenizer, "ptx_data")
    with pytest.raises(ValueError, match="(?s)ptx_data: .*batchsize"):
        BatchStream.from_spec({**SFT, "init_args": {"path": "bundled:tldr_sft", "batchsize": 2}}, tiny_tokenizer, "ptx_data")
