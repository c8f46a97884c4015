"""RLOO with LoRA: the policy adapter trains on a frozen base, the reference is that base with the
adapter disabled (checked on the rollouts of a real fit), and resuming is bitwise exact."""

from __future__ import annotations

import lightning as L
import pytest
import torch

import tests.resume.test_resume as resume
from lit_rlhf.data import TLDRPromptDataModule
from lit_rlhf.models import adapters, load_causal_lm
from lit_rlhf.modules import RLOOModule

LORA = {"r": 4, "alpha": 8}
PROMPTS = dict(path="bundled:tldr_sft", max_prompt_length=96, limit=6, batch_size=2)  # 3 batches per epoch
RLOO = dict(num_generations=2, kl_coef=0.05, lora=LORA, **resume.ONLINE)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class ReferenceProbe(L.Callback):
    """After each rollout's update: its reference log-probs against the bare base model's, and how
    far the policy's log-probs (the adapter on) were from them."""

    def __init__(self, base: torch.nn.Module) -> None:
        self.base = base
        self.ref_error: list[float] = []
        self.policy_gap: list[float] = []

    def on_rollout_end(self, trainer, pl_module, rollout) -> None:
        args = (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_attention_mask)
        groups = torch.arange(rollout.prompt_ids.shape[0]) // pl_module.repeats
        with torch.no_grad():
            bare = pl_module.response_token_logps(self.base, *args, pl_module.sampling.temperature, None, groups)
        mask = rollout.response_attention_mask
        self.ref_error.append(float((rollout.ref_logps - bare)[mask].abs().max()))
        self.policy_gap.append(float((rollout.logps - rollout.ref_logps)[mask].abs().max()))


def test_rloo_with_lora_trains_the_adapter_against_the_adapter_free_base():
    L.seed_everything(0)
    module = RLOOModule(model="tiny-random-llama", **RLOO)
    # one base: the reference is a view of the policy with its adapter disabled, not a module
    assert isinstance(module.ref_model, adapters.AdapterView) and module.ref_model.adapter is None
    assert [name for name, _ in module.named_children()] == ["policy"]
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".policy." in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in module.policy.named_parameters() if not p.requires_grad}

    probe = ReferenceProbe(load_causal_lm("tiny-random-llama", module.tokenizer))
    dm = TLDRPromptDataModule(tokenizer="tiny-random-llama", val_split=None, test_split=None, **PROMPTS)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[probe],
                        enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)

    assert trainer.global_step == 3 and len(probe.ref_error) == 3  # one optimizer step per rollout
    # every rollout's reference is the untouched base (bitwise the same computation)...
    assert max(probe.ref_error) <= 1e-6, probe.ref_error
    # ... while the policy (the adapter on) is the base at the first rollout (LoRA B = 0) and
    # moves away from it once the adapter has trained
    assert probe.policy_gap[0] <= 1e-6 and probe.policy_gap[-1] > 1e-3, probe.policy_gap
    lora_b = [p for n, p in adapters.adapter_parameters(module.policy, adapters.POLICY) if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # trained from B = 0
    changed = [n for n, p in module.policy.named_parameters() if n in frozen and not torch.equal(p, frozen[n])]
    assert not changed, f"frozen base weights changed: {changed[:3]}"
    # the adapter switch is left on the policy
    assert all(layer.active_adapters == [adapters.POLICY] and not layer.disable_adapters
               for layer in adapters._tuner_layers(module.policy))


def test_rloo_with_lora_resumes_exactly(tmp_path, monkeypatch):
    """The resume harness of tests/resume (N batches straight == N/2, stop, resume, N/2 more:
    metrics and every saved tensor bitwise equal) on a LoRA RLOO run."""
    monkeypatch.setitem(resume.CASES, "rloo_lora", (RLOOModule, RLOO, 1, TLDRPromptDataModule, PROMPTS))
    resume.test_resume_is_exact("rloo_lora", tmp_path)
