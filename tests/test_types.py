"""Batches move between devices with `.to`: tensors moved, meta kept, one call from Lightning."""

from __future__ import annotations

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from lit_rlhf.types import PreferenceBatch, PromptBatch, SFTBatch, SingleBatch


def test_to_moves_every_tensor_field_and_keeps_meta_and_none():
    ids = torch.ones(2, 3, dtype=torch.long)
    mask = torch.ones(2, 3, dtype=torch.bool)
    meta = {"prompt": ["a", "b"]}
    batches = [
        SFTBatch(ids, mask, mask, meta),
        PreferenceBatch(ids, mask, mask, torch.tensor([1, 1]), None, meta),
        SingleBatch(ids, mask, mask, torch.tensor([1, 1]), torch.tensor([0.5, -0.5]), None, meta),
        PromptBatch(ids, mask, meta),
    ]
    for batch in batches:
        moved = batch.to(torch.float64)  # a dtype change shows that every tensor went through `.to`
        assert type(moved) is type(batch)
        for name, value in moved._asdict().items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == torch.float64, name
            else:
                assert value is getattr(batch, name), name  # meta and None fields untouched


def test_lightning_moves_a_batch_with_one_call_to_its_to(monkeypatch):
    batch = PromptBatch(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool), {"prompt": ["a", "b"]})
    calls = []
    original = PromptBatch.to
    monkeypatch.setattr(PromptBatch, "to", lambda self, *a, **k: calls.append(a) or original(self, *a, **k))
    moved = move_data_to_device(batch, torch.device("cpu"))
    assert len(calls) == 1 and isinstance(moved, PromptBatch) and moved.meta is batch.meta
