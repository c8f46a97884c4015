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
    module = DROVModule(value_head_init="d11")  # a head that reads more than 0
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


def test_shared_head_value_uses_the_policy_backbone(tiny_tokenizer):
    module = DROVModule(value="shared_head", value_lr=5e-5)
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


def test_learned_scalar_value(tiny_tokenizer):
    module = DROVModule(value="learned_scalar")
    assert module.value is None
    assert module.value_parameters() == [module.batch_value]
    values = module.values(single_batch(tiny_tokenizer))
    assert values.shape == (4,) and (values == values[0]).all()
    with pytest.raises(ValueError, match="value_model names the checkpoint of value: network"):
        DROVModule(value="learned_scalar", value_model="tiny-random-llama")
    with pytest.raises(ValueError, match="unknown value"):
        DROVModule(value="batch")


def test_batch_estimate_value_is_the_batch_mean_of_r_minus_tau_logratio(tiny_tokenizer):
    """The paper's single value: E_x[V(x)] from the batch, mean_b(r - tau log pi/pi_ref)."""
    torch.manual_seed(0)
    module = DROVModule(value="batch_estimate", tau=0.5)
    assert module.value is None and module.batch_value is None and module.value_parameters() == []
    assert [g["name"] for g in module.optimizer_param_groups()] == ["policy", "policy/no_decay"]
    with torch.no_grad():  # move the policy off the reference so the log-ratios are not all 0
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = single_batch(tiny_tokenizer)
    loss, stats = module.compute_loss(batch)
    with torch.no_grad():
        policy = module.sequence_logps(module.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask), batch.loss_mask)
        ref = module.sequence_logps(module.frozen_logps("ref_model", batch.input_ids, batch.attention_mask, batch.loss_mask),
                                    batch.loss_mask)
    expected = (REWARDS - 0.5 * (policy - ref)).mean()
    assert (policy - ref).abs().max() > 1e-3
    torch.testing.assert_close(stats["value/mean"], expected, atol=1e-5, rtol=0)
    # the residuals r - V - tau * logratio of the batch then average to 0 exactly
    assert abs(stats["objective/residuals"].item()) < 1e-5
    with pytest.raises(ValueError, match="batch_estimate"):
        module.values(batch)
    loss.backward()  # the policy still learns; no value parameter exists to get a gradient
    assert module.policy.model.layers[0].self_attn.q_proj.weight.grad is not None


def test_policy_logit_value_is_the_policys_logit_at_the_last_prompt_token(tiny_tokenizer):
    """The paper's shared network: the policy's own logits as value outputs."""
    module = DROVModule(value="policy_logit", value_lr=5e-5)
    assert module.value_token_id == tiny_tokenizer.pad_token_id  # our default
    assert module.value is None and module.value_parameters() == []
    groups = module.optimizer_param_groups()
    assert {g["name"] for g in groups} <= {"policy", "policy/no_decay"}
    assert sum(len(g["params"]) for g in groups) == len([p for p in module.policy.parameters() if p.requires_grad])
    batch = single_batch(tiny_tokenizer, extra_pad=3)
    values = module.values(batch)
    with torch.no_grad():
        logits = module.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, T, V)
    expected = logits[torch.arange(4), batch.prompt_lengths - 1, tiny_tokenizer.pad_token_id]
    torch.testing.assert_close(values.detach(), expected, atol=1e-5, rtol=0)
    other = DROVModule(value="policy_logit", value_token_id=7)
    torch.testing.assert_close(other.values(batch).detach(), logits[torch.arange(4), batch.prompt_lengths - 1, 7],
                               atol=1e-5, rtol=0)
    # the value loss trains the policy's own parameters (here: its output layer)
    _, stats = module.compute_loss(batch)
    out = module.values(batch)
    (0.5 * (REWARDS - out) ** 2).mean().backward()
    assert module.policy.get_output_embeddings().weight.grad[tiny_tokenizer.pad_token_id].abs().sum() > 0
    with pytest.raises(ValueError, match="not a vocabulary id"):
        DROVModule(value="policy_logit", value_token_id=10**9)
    with pytest.raises(ValueError, match="value_token_id is read by value: policy_logit only"):
        DROVModule(value="network", value_token_id=3)


@pytest.mark.parametrize("kwargs", [{}, {"value": "shared_head"}, {"lora": {"r": 2, "alpha": 4}}])
def test_a_fresh_value_head_starts_at_zero_and_learns(tiny_tokenizer, kwargs):
    torch.manual_seed(0)
    batch = single_batch(tiny_tokenizer)
    module = DROVModule(lr=1e-3, value_lr=1e-2, **kwargs)
    assert (module.values(batch) == 0).all()  # V(x) = 0, the normalised rewards' mean, for every prompt
    optimizer = torch.optim.AdamW(module.optimizer_param_groups(), lr=module.hparams.lr)
    for _ in range(3):  # the zero head blocks the body's gradient for one step only
        loss, _ = module.compute_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    values = module.values(batch)
    assert values.detach().std() > 1e-4, values  # per-prompt values, not one bias for all
    d11 = DROVModule(value_head_init="d11", **kwargs)
    weight = d11.value.head.weight
    assert d11.values(batch).abs().min() > 0
    assert abs(float(weight.std()) - (weight.shape[1] + 1) ** -0.5) < 0.3 * (weight.shape[1] + 1) ** -0.5  # D11
    with pytest.raises(ValueError, match="unknown value_head_init"):
        DROVModule(value_head_init="normal")


def test_bad_input_is_named(tiny_tokenizer):
    with pytest.raises(ValueError, match="tau"):
        DROVModule(tau=0.0)
    batch = single_batch(tiny_tokenizer)._replace(rewards=None)
    with pytest.raises(ValueError, match="rewards"):
        DROVModule(value="learned_scalar").compute_loss(batch)


@pytest.mark.parametrize("value", ["network", "learned_scalar"])
def test_a_few_steps_lower_the_loss(tiny_tokenizer, value):
    torch.manual_seed(0)
    module = DROVModule(value=value, lr=1e-3, value_lr=1e-2)
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


def grouped_batch(tokenizer, rewards=(1.0, -1.0, 0.5, -0.5, 0.2, -0.2)):
    """Two prompts with three completions each, interleaved, through the library's collator
    (which numbers the prompt groups)."""
    from lit_rlhf.data.collate import SingleCollator

    prompts = ["Q: 1+1?\nA:", "Say hi."]
    completions = [" 2", " hi", " two", " hi there", " 3", " hello"]
    examples = []
    for i, (completion, reward) in enumerate(zip(completions, rewards)):
        examples.append({"_prompt_ids": tokenizer(prompts[i % 2], add_special_tokens=False)["input_ids"],
                         "_completion_ids": tokenizer(completion, add_special_tokens=False)["input_ids"]
                         + [tokenizer.eos_token_id], "_reward": reward})
    return SingleCollator(tokenizer.pad_token_id, reward_mean=0.0, reward_std=1.0)(examples)


@pytest.mark.parametrize("value", ["network", "policy_logit", "batch_estimate"])
def test_rows_sharing_a_prompt_share_its_forward_with_the_same_loss_and_gradients(tiny_tokenizer, value):
    torch.manual_seed(0)
    module = DROVModule(value=value)
    if module.value is not None:
        with torch.no_grad():  # a head that reads more than 0 (D11 starts it at 0)
            for p in module.value.head.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    batch = grouped_batch(tiny_tokenizer)
    assert batch.prompt_groups.tolist() == [0, 1, 0, 1, 0, 1]
    assert batch.sharing is not None and batch._replace(prompt_groups=None).sharing is None
    results = []
    for b in (batch, batch._replace(prompt_groups=None)):  # shared forward, then every row apart
        module.zero_grad()
        loss, _ = module.compute_loss(b)
        loss.backward()
        grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
        results.append((loss.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    assert len(results[0][1]) == len(results[1][1]) > 0
    for shared, apart in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(shared, apart, atol=1e-5, rtol=1e-4)


def test_the_value_network_runs_once_per_distinct_prompt(tiny_tokenizer):
    module = DROVModule(value="network")
    with torch.no_grad():  # the fresh head reads 0 everywhere (D11): give the prompts values of their own
        for p in module.value.head.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    batch = grouped_batch(tiny_tokenizer)
    seen = []
    score = module.value.score
    module.value.score = lambda ids, mask, index: (seen.append(ids.shape[0]), score(ids, mask, index=index))[1]
    values = module.values(batch)
    assert seen == [2]  # two prompts, six rows
    assert values.shape == (6,)
    torch.testing.assert_close(values[0::2], values[0].expand(3))  # one V(x) per prompt
    torch.testing.assert_close(values[1::2], values[1].expand(3))
    assert abs(float(values[0] - values[1])) > 1e-3
    with torch.no_grad():  # each row's own V(x), read at its last prompt token
        every_position = module.value(batch.input_ids, batch.attention_mask)  # (B, T)
    torch.testing.assert_close(values, every_position[torch.arange(6), batch.prompt_lengths - 1], atol=1e-5, rtol=0)
    seen.clear()
    apart = module.values(batch._replace(prompt_groups=None))
    assert seen == [6]
    torch.testing.assert_close(apart, values, atol=1e-5, rtol=0)
