"""LoRA: one frozen base serving policy, reference, value and reward as named adapters."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.training.memory import Memory
from lit_rlhf.models import adapters, load_causal_lm, load_reward_model, scalar_adapters
from lit_rlhf.modules import DPOModule, DROVModule, PPOModule, RewardModule
from lit_rlhf.rewards import CharacterFractionReward

LORA = {"r": 4, "alpha": 8}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def batch(tokenizer, n=3, length=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 200, (n, length), generator=gen)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, -3:] = False  # one right-padded row
    ids[~mask] = tokenizer.pad_token_id
    loss_mask = mask.clone()
    loss_mask[:, :4] = False
    return ids, mask, loss_mask


def perturb(model, adapter, seed=0):
    """Move an adapter away from its identity initialisation (LoRA B starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in adapters.adapter_parameters(model, adapter):
            p.add_(0.5 * torch.randn(p.shape, generator=gen))


def test_lora_config_forms_and_bad_input():
    from peft import LoraConfig

    short = adapters.lora_config({"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    assert (short.r, short.lora_alpha, short.lora_dropout) == (4, 8, 0.0)
    assert set(short.target_modules) == {"q_proj", "v_proj"}
    assert adapters.lora_config({}).target_modules == "all-linear"
    by_path = adapters.lora_config({"class_path": "peft.LoraConfig", "init_args": {"r": 2, "lora_alpha": 4}})
    assert isinstance(by_path, LoraConfig) and by_path.r == 2
    assert adapters.lora_config(None) is None
    with pytest.raises(ValueError, match="unknown lora keys \\['rank'\\]"):
        adapters.lora_config({"rank": 4})
    with pytest.raises(ValueError, match="class_path must name peft.LoraConfig"):
        adapters.lora_config({"class_path": "torch.nn.Linear"})
    with pytest.raises(ValueError, match="lora.r must be >= 1"):
        adapters.lora_config({"r": 0})


def test_reference_is_the_base_with_the_adapter_disabled():
    module = DPOModule(model="tiny-random-llama", lora=LORA)
    assert isinstance(module.ref_model, adapters.AdapterView)
    # no second copy of the base: every tensor of the module belongs to the policy
    assert [name for name, _ in module.named_children()] == ["policy"]
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".policy." in n for n in trainable)
    ids, mask, loss_mask = batch(module.tokenizer)
    plain = load_causal_lm("tiny-random-llama", module.tokenizer)
    dense = DPOModule(model="tiny-random-llama", memory=Memory(logprob_chunk_size=None))
    expected = dense.model_logps(plain, ids, mask, loss_mask)
    perturb(module.policy, adapters.POLICY)
    ref = module.frozen_logps("ref_model", ids, mask, loss_mask)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-5)  # the untouched base
    policy = module.policy_logps(ids, mask, loss_mask)
    assert (policy - ref).abs().max() > 1e-2  # the adapter is on for the policy
    # the adapter switch is restored: the policy forward after the reference is unchanged
    torch.testing.assert_close(module.policy_logps(ids, mask, loss_mask), policy, rtol=0, atol=0)


def test_chunked_log_probs_equal_dense_with_lora():
    """Values and gradients of the chunked output-layer path equal the dense logits (fp32)."""
    torch.manual_seed(0)
    chunked = DPOModule(model="tiny-random-llama", lora=LORA, memory=Memory(logprob_chunk_size=3))
    dense = DPOModule(model="tiny-random-llama", lora=LORA, memory=Memory(logprob_chunk_size=None))
    perturb(chunked.policy, adapters.POLICY)
    dense.policy.load_state_dict(chunked.policy.state_dict())
    ids, mask, loss_mask = batch(chunked.tokenizer)
    a = chunked.policy_logps(ids, mask, loss_mask)
    b = dense.policy_logps(ids, mask, loss_mask)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    a[loss_mask].mean().backward()  # a token-mean loss, as the methods' losses
    b[loss_mask].mean().backward()
    grads_a = {n: p.grad for n, p in chunked.policy.named_parameters() if p.requires_grad}
    grads_b = {n: p.grad for n, p in dense.policy.named_parameters() if p.requires_grad}
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=0, atol=1e-5)


def _lora_reward_export(tmp_path):
    L.seed_everything(0)
    reward = RewardModule(model="tiny-random-llama", lora=LORA)
    perturb(reward.reward_peft, adapters.REWARD, seed=3)
    with torch.no_grad():
        reward.reward_model.head.bias.fill_(0.25)
    reward.export_hf(tmp_path / "rm")
    return reward


def test_lora_reward_model_exports_both_ways(tmp_path):
    from transformers import AutoModelForSequenceClassification

    reward = _lora_reward_export(tmp_path)
    ids, mask, _ = batch(reward.tokenizer)
    with torch.no_grad():
        expected = reward.reward_model.score(ids, mask)
    trainable = [n for n, p in reward.named_parameters() if p.requires_grad]
    assert all(".reward." in n or n.startswith("reward_model.head") for n in trainable)
    # merged: plain transformers (the RMSNorm head bias is in config.reward_bias) and our loader
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    with torch.no_grad():
        plain = classifier(input_ids=ids, attention_mask=mask.long()).logits.squeeze(-1)
    torch.testing.assert_close(plain + classifier.config.reward_bias, expected, rtol=0, atol=1e-4)
    torch.testing.assert_close(load_reward_model(str(tmp_path / "rm")).score(ids, mask), expected, rtol=0, atol=1e-4)
    # the adapter alone, PEFT format, with its head
    assert (tmp_path / "rm" / "adapter" / "adapter_config.json").is_file()
    with torch.no_grad():
        from_adapter = load_reward_model(str(tmp_path / "rm" / "adapter")).score(ids, mask)
    torch.testing.assert_close(from_adapter, expected, rtol=0, atol=1e-4)


def test_ppo_policy_value_reward_are_adapters_on_one_base(tmp_path):
    reward = _lora_reward_export(tmp_path)
    adapter_dir = str(tmp_path / "rm" / "adapter")
    module = PPOModule(model="tiny-random-llama", reward_model=adapter_dir, max_new_tokens=4, lora=LORA,
                       value_lr=1e-3)
    assert adapters.adapter_names(module.policy) == ["policy", "reward", "value"]
    # one base: the module's only transformer is the policy's; reward and value add a head each
    assert sorted(name for name, _ in module.named_children()) == ["policy", "reward_model", "value_model"]
    assert sum(p.numel() for p in module.reward_model.parameters()) == module.reward_model.head.weight.numel() + 1
    ids, mask, _ = batch(module.tokenizer)
    with torch.no_grad():
        expected = reward.reward_model.score(ids, mask)
        torch.testing.assert_close(module.reward_model.score(ids, mask), expected, rtol=0, atol=1e-5)
        # D22: the value starts as the reward model (adapter and head)
        torch.testing.assert_close(module.value_model.score(ids, mask), expected, rtol=0, atol=1e-5)
    # the reward adapter is frozen; policy and value train in their own groups and learning rates
    groups = {g["name"]: g for g in module.optimizer_param_groups()}
    assert {n.split("/")[0] for n in groups} == {"policy", "value"}
    ids_by_group = {name: {id(p) for p in g["params"]} for name, g in groups.items()}
    policy_ids = ids_by_group["policy"] | ids_by_group.get("policy/no_decay", set())
    value_ids = ids_by_group["value"] | ids_by_group.get("value/no_decay", set())
    assert policy_ids == {id(p) for _, p in adapters.adapter_parameters(module.policy, "policy")}
    assert value_ids == {id(p) for _, p in adapters.adapter_parameters(module.policy, "value")} | {
        id(p) for p in module.value_model.head.parameters()}
    assert groups["value"]["lr"] == 1e-3
    assert not any(p.requires_grad for _, p in adapters.adapter_parameters(module.policy, "reward"))


def test_gradients_of_one_adapter_never_reach_another(tmp_path):
    def build(**kwargs):
        module = PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward()], max_new_tokens=4,
                           lora=LORA, **kwargs)
        perturb(module.policy, "policy")
        perturb(module.policy, "value", seed=1)
        return module.train()

    module = build(memory=Memory(gradient_checkpointing=True))
    reference = build()  # no checkpointing
    reference.load_state_dict(module.state_dict())  # the same weights (LoRA A starts random)
    ids, mask, loss_mask = batch(module.tokenizer)

    def grads(m, adapter):
        return {n: p.grad for n, p in adapters.adapter_parameters(m.policy, adapter)}

    # the value loss alone: gradients in the value adapter and head only
    for m in (module, reference):
        m.value_model(ids, mask).square().mean().backward()
        assert all(g is not None and g.abs().sum() > 0 for g in grads(m, "value").values())
        assert all(g is None for g in grads(m, "policy").values())
        assert m.value_model.head.weight.grad is not None
    # checkpointing recomputes the value forward in backward under the value adapter (not the
    # policy's, which is active again by then): the same gradients as without it
    for name, g in grads(module, "value").items():
        torch.testing.assert_close(g, grads(reference, "value")[name], rtol=0, atol=1e-6, msg=name)
    # the policy loss alone (after a value forward, as in PPO's loss): policy adapter only
    for m in (module, reference):
        m.zero_grad(set_to_none=True)
        logps = m.policy_logps(ids, mask, loss_mask)
        m.value_model(ids, mask)
        logps[loss_mask].mean().backward()
        assert all(g is not None and g.abs().sum() > 0 for g in grads(m, "policy").values())
        assert all(g is None for g in grads(m, "value").values())
        assert m.value_model.head.weight.grad is None
    for name, g in grads(module, "policy").items():
        torch.testing.assert_close(g, grads(reference, "policy")[name], rtol=0, atol=1e-6, msg=name)


def test_drov_value_is_an_adapter_with_its_own_learning_rate():
    module = DROVModule(model="tiny-random-llama", lora=LORA, value_lr=5e-4)
    assert isinstance(module.value, scalar_adapters.AdapterScalarModel) and module.value.adapter == "value"
    assert adapters.adapter_names(module.policy) == ["policy", "value"]
    groups = {g["name"]: g for g in module.optimizer_param_groups()}
    value = {id(p) for name, g in groups.items() if name.startswith("value") for p in g["params"]}
    policy = {id(p) for name, g in groups.items() if name.startswith("policy") for p in g["params"]}
    assert not value & policy
    assert policy == {id(p) for _, p in adapters.adapter_parameters(module.policy, "policy")}
    assert groups["value"]["lr"] == 5e-4


def test_checkpoints_hold_the_adapters_not_the_frozen_base():
    module = DPOModule(model="tiny-random-llama", lora=LORA)
    perturb(module.policy, "policy")
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    saved = checkpoint["state_dict"]
    assert saved and all("lora_" in k and ".policy." in k for k in saved)
    restored = DPOModule(model="tiny-random-llama", lora=LORA)
    restored.load_state_dict(saved)  # the base is rebuilt from the model name
    for key, value in module.state_dict().items():
        assert torch.equal(value, restored.state_dict()[key]), key


def test_nonfinite_guard_sees_adapter_gradients():
    from lit_rlhf.training.base import NonFiniteError

    module = PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward()], max_new_tokens=4, lora=LORA)
    ids, mask, _ = batch(module.tokenizer)
    module.value_model(ids, mask).sum().backward()
    assert module.gradients_finite()
    name, param = adapters.adapter_parameters(module.policy, "value")[0]
    param.grad[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="lora_A.value"):
        module.gradients_finite()
