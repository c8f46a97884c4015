"""`frozen_placement: whole` keeps frozen models out of the module tree (never sharded), while
they still move and cast with the module and give the same losses as the default."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.training.memory import Memory
from lit_rlhf.modules import DPOModule
from lit_rlhf.types import PreferenceBatch


def pair_batch(tokenizer):
    chosen, rejected = " good answer", " bad"
    rows = []
    for completion in (chosen, rejected):
        p = tokenizer("Q: which?\nA:")["input_ids"]
        c = tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p, c))
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((2, width), tokenizer.pad_token_id)
    attn = torch.zeros((2, width), dtype=torch.bool)
    loss = torch.zeros((2, width), dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attn[i, : len(p) + len(c)] = True
        loss[i, len(p): len(p) + len(c)] = True
    return PreferenceBatch(ids, attn, loss, torch.tensor([len(rows[0][0]), len(rows[1][0])]))


def test_whole_frozen_model_is_outside_the_module_tree_but_moves_with_it():
    whole = DPOModule(model="tiny-random-llama", memory=Memory(frozen_placement="whole"))
    partitioned = DPOModule(model="tiny-random-llama")
    assert "ref_model" in dict(partitioned.named_children())
    assert "ref_model" not in dict(whole.named_children())
    ref_params = {id(p) for p in whole.ref_model.parameters()}
    assert not ref_params & {id(p) for p in whole.parameters()}, "a sharding strategy would partition it"
    assert not any(k.startswith("ref_model.") for k in whole.state_dict())
    whole.to(torch.float64)
    assert next(whole.ref_model.parameters()).dtype == torch.float64
    whole.train()
    assert not whole.ref_model.training and whole.policy.training


def test_placements_give_the_same_loss():
    whole = DPOModule(model="tiny-random-llama", memory=Memory(frozen_placement="whole"))
    partitioned = DPOModule(model="tiny-random-llama")
    batch = pair_batch(whole.tokenizer)
    with torch.no_grad():
        a = whole.reference_logps(batch)
        b = partitioned.reference_logps(batch)
    assert torch.equal(a, b)


def test_unknown_placement_is_refused():
    with pytest.raises(ValueError, match="frozen_placement"):
        DPOModule(model="tiny-random-llama", memory=Memory(frozen_placement="sharded"))
