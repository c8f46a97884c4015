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


def _rollout(n: int = 4, **fields):
    from lit_rlhf.types import Rollout

    ids = torch.arange(n * 3).view(n, 3)
    mask = torch.ones(n, 3, dtype=torch.bool)
    return Rollout(ids, mask, ids + 100, mask, torch.ones(n, dtype=torch.bool), None, scores=torch.arange(n) * 1.0,
                   meta={"prompt": [f"p{i}" for i in range(n)]}, **fields)


def test_rollout_extras_follow_the_rows():
    """A method's per-row extras are checked, sliced with the rows (minibatches), concatenated
    (dynamic sampling), moved with the rollout and saved as plain tensors."""
    import io

    import pytest

    from lit_rlhf.online.dynamic_sampling import cat_rollouts

    rollout = _rollout(4).with_extras(baseline=torch.tensor([10.0, 11.0, 12.0, 13.0]), pair=torch.arange(8).view(4, 2))
    assert rollout.with_scores(torch.zeros(4)).extras is rollout.extras  # shaping hooks keep them
    part = rollout.rows(torch.tensor([3, 1]))
    assert part.extras["baseline"].tolist() == [13.0, 11.0] and part.extras["pair"].tolist() == [[6, 7], [2, 3]]
    assert part.meta["prompt"] == ["p3", "p1"] and part.scores.tolist() == [3.0, 1.0] and part.logps is None
    masked = rollout.rows(torch.tensor([True, False, False, True]))
    assert masked.extras["baseline"].tolist() == [10.0, 13.0] and masked.meta["prompt"] == ["p0", "p3"]
    joined = cat_rollouts([part, masked])
    assert joined.extras["baseline"].tolist() == [13.0, 11.0, 10.0, 13.0] and joined.num_rows == 4
    with pytest.raises(ValueError, match="different extras"):
        cat_rollouts([part, _rollout(2)])
    moved = rollout.to(torch.float64)
    assert moved.extras["baseline"].dtype == torch.float64 and moved.scores.dtype == torch.float64
    buffer = io.BytesIO()
    torch.save(dict(rollout.extras), buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=True)["baseline"], rollout.extras["baseline"])
    for bad in (torch.zeros(3), torch.tensor(1.0), [1.0, 2.0, 3.0, 4.0]):
        with pytest.raises(ValueError, match="one row per response"):
            rollout.with_extras(bad=bad)
