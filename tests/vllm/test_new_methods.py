"""ReMax, rejection sampling, online DPO, PPO-ptx and on-policy distillation (both losses) sample
with the vLLM engine (`rollout: VLLMSampler`): they train (PPO-ptx with its SFT term at every
step), the student's log-probs are compared with the engine's (`rollout/sampler_logprob_diff`), and
ReMax's greedy baselines decoded by the engine are the policy's greedy responses as the hf sampler
decodes them."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.generation import SamplingConfig, generate_responses
from lit_rlhf.modules import (
    DistillationModule,
    GRPOModule,
    OnlineDPOModule,
    PPOPtxModule,
    RejectionSamplingModule,
    ReMaxModule,
)
from lit_rlhf.online import RolloutCorrection, VLLMSampler
from lit_rlhf.rewards import CharacterFractionReward
from tests.resume.test_resume import PTX_DATA
from tests.vllm.conftest import attach
from tests.vllm.test_fit import LETTERS, prompt_loader

METHODS = {
    "remax": (ReMaxModule, dict(num_generations=2), [8, 4]),  # per rollout: the samples, then the greedy rows
    "rejection_sampling": (RejectionSamplingModule, dict(num_generations=2), [8]),
    "online_dpo": (OnlineDPOModule, dict(), [8]),
    # one PPO epoch: the 2 optimizer steps are 2 rollouts; an SFT batch joins each step
    "ppo_ptx": (PPOPtxModule, dict(ptx_data=PTX_DATA, ptx_coef=1.0, ppo_epochs=1), [4]),
    # the student samples with the engine; the teacher is its starting weights given a context
    "distill": (DistillationModule, dict(teacher="base", teacher_context="Answer:", num_generations=2), [8]),
    "distill_gkd": (DistillationModule, dict(teacher="base", teacher_context="Answer:", num_generations=2, loss="gkd",
                                             teacher_top_k=4), [8]),
    # the engine's samples weighed by min(pi_train / pi_engine, 2) in the policy-gradient term
    "distill_tis": (DistillationModule, dict(teacher="base", teacher_context="Answer:", num_generations=2,
                                             rollout=VLLMSampler(tis_cap=2.0)), [8]),
    # GRPO with the engine's samples masked by their geometric-mean ratio (kept within [0.95, 1.05])
    "grpo_correction": (GRPOModule, dict(num_generations=2, kl_coef=0.0, rollout=VLLMSampler(
        correction=RolloutCorrection("mask", "geometric", 1.05, 0.95))), [8]),
}
WEIGHED = ("distill_tis", "grpo_correction")  # the methods given a rollout correction


class FirstShaped(L.Callback):
    def __init__(self):
        self.rollouts = []

    def on_rollout_scores(self, trainer, pl_module, rollout):
        self.rollouts.append(rollout)
        return rollout


@pytest.mark.parametrize("name", list(METHODS))
def test_new_online_methods_sample_with_the_engine(name, vllm_model_dir, engine):
    cls, args, rows = METHODS[name]
    args = dict(args)
    rollout = args.pop("rollout", None) or VLLMSampler()
    L.seed_everything(0)
    module = attach(cls(model=vllm_model_dir, rollout=rollout, reward_fns=[CharacterFractionReward(LETTERS)],
                        max_new_tokens=6, lr=1e-2, lr_scheduler="constant", log_completions_every_n_steps=0, **args),
                    engine)
    initial = {k: v.clone() for k, v in module.policy.state_dict().items()}
    weighed = []
    tis_weights = module.tis_weights
    module.tis_weights = lambda *a: weighed.append(w := tis_weights(*a)) or w
    calls = []
    generate = engine.generate
    engine.generate = lambda *a, **k: calls.append(a[0].shape[0]) or generate(*a, **k)
    shaped = FirstShaped()
    try:
        trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, log_every_n_steps=1,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=[shaped])
        trainer.fit(module, prompt_loader(module.tokenizer))
    finally:
        del engine.generate  # back to the class method
    assert calls == rows * 2  # every response of both rollouts came from the engine
    assert float(trainer.callback_metrics["train/time/weight_sync_check"]) > 0  # the sync after step 1, checked
    assert any(not torch.equal(v, initial[k]) for k, v in module.policy.state_dict().items())
    assert all(w is None for w in weighed) != (name in WEIGHED), weighed  # weights only with a correction
    if name == "grpo_correction":  # the engine agrees with the learner: nothing masked, the mismatch logged
        assert all((((w >= 0.95) & (w <= 1.05)) | (w == 0)).all() for w in weighed)  # 0 on padding only
        assert float(trainer.callback_metrics["train/rollout_correction/masked_fraction"]) == 0.0
        assert 0.0 <= float(trainer.callback_metrics["train/rollout_correction/kl_k3"]) < 1e-3
    if name.startswith("distill"):  # the learner's log-probs of the engine's samples, against the engine's
        diff = trainer.callback_metrics["train/rollout/sampler_logprob_diff"]
        assert torch.isfinite(diff) and float(diff) < 0.05, float(diff)
    if name == "ppo_ptx":  # the SFT stream gave one batch to each optimizer step
        assert module.ptx_batches == 2
    if name == "remax":  # the engine's greedy decode of the initial policy is hf's
        greedy = shaped.rollouts[0]
        policy = cls(model=vllm_model_dir, reward_fns=[CharacterFractionReward(LETTERS)]).policy
        policy.load_state_dict(initial)
        tok = module.tokenizer
        ids, _, _ = generate_responses(policy, greedy.prompt_ids, greedy.prompt_mask,
                                       SamplingConfig(max_new_tokens=6, do_sample=False), tok.eos_token_id,
                                       tok.pad_token_id)
        assert torch.equal(ids, greedy.response_ids)
