"""DROVModule: V(x) at the last prompt token, separate networks and learning rates, ablations."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.modules.drov import DROVModule, last_prompt_index
from lit_rlhf.types import SingleBatch

PROMPTS = ["Q: 1+1?\nA:", "Say hi.", "Name a colour:", "Count:"]
COMPLETIONS = [" 2", " hi there", " red", " 1 2 3"]
REWARDS = torch.tensor([1.0, -1.0, 0.5, -0.5])


def single_batch(tokenizer, prompts=PROMPTS, completions=COMPLETIONS, rewards=REWARDS, extra_pad: int = 0) -> SingleBatch:
    rows, prompt_lengths = [], []
    for prompt, completion in zip(prompts, completions):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p, c))
        prompt_lengths.append(len(p))
    length = max(len(p) + len(c) for p, c in rows) + extra_pad
    ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    keep = torch.zeros(len(rows), length, dtype=torch.bool)
    scored = torch.zeros_like(keep)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        keep[i, : len(p) + len(c)] = True
        scored[i, len(p) : len(p) + len(c)] = True
    return SingleBatch(ids, keep, scored, torch.tensor(prompt_lengths), rewards=rewards)


def test_value_is_read_at_the_last_prompt_token(tiny_tokenizer):
    module = DROVModule()
    batch = single_batch(tiny_tokenizer, extra_pad=4)  # right padded, prompts of different lengths
    assert len(set(batch.prompt_lengths.tolist())) > 1
    assert last_prompt_index(batch.prompt_lengths).tolist() == (batch.prompt_lengths - 1).tolist()
    values = module.values(batch)  # (B,)
    assert values.shape == (4,)
    with torch.no_grad():
        every_position = module.value(batch.input_ids, batch.attention_mask)  # (B, T)
    expected = every_position[torch.arange(4), batch.prompt_lengths - 1]
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=0)
    # not at the last real token (the EOS), which is what a reward model would read
    assert not torch.allclose(values, every_position[torch.arange(4), batch.attention_mask.sum(1) - 1], atol=1e-4)
    # V(x) sees the prompt only: other completions (and padding) leave it unchanged
    other = single_batch(tiny_tokenizer, completions=[" no", " a much longer answer", " x", " y"])
    torch.testing.assert_close(module.values(other), values, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="non-empty prompt"):
        last_prompt_index(torch.tensor([3, 0]))


def test_two_learning_rates_in_one_optimizer_and_separate_networks():
    module = DROVModule(lr=2e-4, value_lr=3e-5)
    policy_ids = {id(p) for p in module.policy.parameters()}
    value_ids = {id(p) for p in module.value.parameters()}
    assert not policy_ids & value_ids  # separate network by default
    assert not any(p.data_ptr() == q.data_ptr() for p in module.policy.parameters() for q in module.value.parameters())
    groups = module.optimizer_param_groups()
    by_name = {}
    for group in groups:
        network = group["name"].split("/")[0]  # `policy`, `policy/no_decay`, `value`, `value/no_decay`
        by_name.setdefault(network, set()).update(id(p) for p in group["params"])
        assert group["lr"] == {"policy": 2e-4, "value": 3e-5}[network]
    assert len({g["name"] for g in groups}) == len(groups)  # distinct: LearningRateMonitor refuses duplicates
    assert by_name == {"policy": policy_ids, "value": value_ids}
    optimizer = torch.optim.AdamW(groups, lr=module.hparams.lr)
    assert sorted({g["lr"] for g in optimizer.param_groups}) == [3e-5, 2e-4]
    assert DROVModule().hparams.lr == 1e-4 and DROVModule().hparams.value_lr == 1e-4  # the paper's defaults


def test_shared_value_uses_the_policy_backbone(tiny_tokenizer):
    module = DROVModule(value_model="shared", value_lr=5e-5)
    policy_ids = {id(p) for p in module.policy.parameters()}
    assert {id(p) for p in module.value.backbone.parameters()} <= policy_ids
    head_ids = {id(p) for p in module.value.head.parameters()}
    assert not head_ids & policy_ids
    groups = module.optimizer_param_groups()
    seen = [id(p) for g in groups for p in g["params"]]
    assert len(seen) == len(set(seen)) == len(policy_ids) + len(head_ids)  # every parameter once
    assert {id(p) for g in groups if g["name"].startswith("value") for p in g["params"]} == head_ids
    # the value loss reaches the shared backbone
    loss, _ = module.compute_loss(single_batch(tiny_tokenizer))
    torch.autograd.backward(loss)
    assert module.policy.model.layers[0].self_attn.q_proj.weight.grad is not None
    assert module.value.head.weight.grad is not None


def test_one_value_per_batch_ablation(tiny_tokenizer):
    module = DROVModule(value_per="batch")
    assert module.value is None
    assert module.value_parameters() == [module.batch_value]
    values = module.values(single_batch(tiny_tokenizer))
    assert values.shape == (4,) and (values == values[0]).all()
    with pytest.raises(ValueError, match="value_per='batch'"):
        DROVModule(value_per="batch", value_model="shared")


def test_bad_input_is_named(tiny_tokenizer):
    with pytest.raises(ValueError, match="tau"):
        DROVModule(tau=0.0)
    batch = single_batch(tiny_tokenizer)._replace(rewards=None)
    with pytest.raises(ValueError, match="rewards"):
        DROVModule(value_per="batch").compute_loss(batch)


@pytest.mark.parametrize("value_per", ["example", "batch"])
def test_a_few_steps_lower_the_loss(tiny_tokenizer, value_per):
    torch.manual_seed(0)
    module = DROVModule(value_per=value_per, lr=1e-3, value_lr=1e-2)
    batch = single_batch(tiny_tokenizer)
    optimizer = torch.optim.AdamW(module.optimizer_param_groups(), lr=module.hparams.lr)
    objectives = []
    for _ in range(8):
        loss, stats = module.compute_loss(batch)
        objectives.append(stats["objective/dro"].item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert objectives[-1] < 0.8 * objectives[0], objectives
