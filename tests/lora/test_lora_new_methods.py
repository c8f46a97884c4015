"""ReMax, rejection sampling and online DPO with LoRA: only the policy adapter trains, the base
stays frozen, and (online DPO, ReMax with a KL) the reference is the base with the adapter off.
PPO-ptx with LoRA: its SFT term trains the policy adapter."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.data import TLDRPromptDataModule
from lit_rlhf.models import adapters
from lit_rlhf.modules import OnlineDPOModule, RejectionSamplingModule, ReMaxModule
from tests.resume.test_resume import LORA, ONLINE, PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

METHODS = {
    "remax": (ReMaxModule, dict(num_generations=2, kl_coef=0.05)),
    "rejection_sampling": (RejectionSamplingModule, dict(num_generations=2)),
    "online_dpo": (OnlineDPOModule, dict(beta=0.1)),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_lora_trains_the_policy_adapter_only(name):
    cls, args = METHODS[name]
    L.seed_everything(0)
    module = cls(model="tiny-random-llama", lora=LORA, **args, **ONLINE)
    if getattr(module, "ref_model", None) is not None:
        assert isinstance(module.ref_model, adapters.AdapterView) and module.ref_model.adapter is None
    assert [n for n, _ in module.named_children()] == ["policy"]
    frozen = {n: p.detach().clone() for n, p in module.policy.named_parameters() if not p.requires_grad}
    dm = TLDRPromptDataModule(tokenizer="tiny-random-llama", val_split=None, test_split=None, **PROMPTS)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 2
    lora_b = [p for n, p in adapters.adapter_parameters(module.policy, adapters.POLICY) if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # trained from B = 0
    changed = [n for n, p in module.policy.named_parameters() if n in frozen and not torch.equal(p, frozen[n])]
    assert not changed, f"frozen base weights changed: {changed[:3]}"


def test_lora_ppo_ptx_trains_the_adapters_and_its_sft_term_reaches_the_policy_adapter():
    """PPO-ptx with LoRA: policy and value are adapters on the frozen base (as PPO's); the SFT
    term's gradient goes through the policy adapter: with ptx_coef 1 it ends elsewhere than with 0
    after the same rollout, and the value adapter (which the term never touches) does not."""
    from lit_rlhf.modules import PPOPtxModule
    from tests.resume.test_resume import PTX_DATA

    def fit(ptx_coef: float):
        L.seed_everything(0)
        module = PPOPtxModule(model="tiny-random-llama", lora=LORA, ptx_data=PTX_DATA, ptx_coef=ptx_coef, ppo_epochs=1,
                              max_grad_norm=None, **ONLINE)  # no clipping: the value's step is its own gradient's
        frozen = {n: p.detach().clone() for n, p in module.policy.named_parameters() if not p.requires_grad}
        dm = TLDRPromptDataModule(tokenizer="tiny-random-llama", val_split=None, test_split=None, **PROMPTS)
        L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=False, limit_val_batches=0).fit(module, datamodule=dm)
        changed = [n for n, p in module.policy.named_parameters() if n in frozen and not torch.equal(p, frozen[n])]
        assert not changed, f"frozen base weights changed: {changed[:3]}"
        assert module.ptx_batches == 1
        return {name: {n: p.detach().clone() for n, p in adapters.adapter_parameters(module.policy, name)}
                for name in (adapters.POLICY, adapters.VALUE)}

    plain, ptx = fit(0.0), fit(1.0)
    assert any(p.abs().sum() > 0 for n, p in ptx[adapters.POLICY].items() if "lora_B" in n)  # trained from B = 0
    assert any(not torch.equal(p, plain[adapters.POLICY][n]) for n, p in ptx[adapters.POLICY].items())
    assert all(torch.equal(p, plain[adapters.VALUE][n]) for n, p in ptx[adapters.VALUE].items())
