"""XPO on the vLLM backend: the policy's responses and the reference's both come from vLLM, the
reference's from an engine of its own (`VLLMSampler.for_model`), built once and never reloaded."""

from __future__ import annotations

import lightning as L

from lit_rlhf.generation.vllm import VLLMEngine
from lit_rlhf.generation.vllm_process import live_in_process_engines
from lit_rlhf.modules import XPOModule
from lit_rlhf.online import VLLMSampler
from lit_rlhf.rewards import CharacterFractionReward
from tests.learning.tasks import make_prompts, prompt_loader
from tests.modules.test_rejection_sampling import Ended
from tests.vllm.conftest import attach


def test_policy_and_reference_responses_both_come_from_vllm(vllm_model_dir, engine, monkeypatch):
    L.seed_everything(0)
    engines = live_in_process_engines()  # the session's
    module = attach(XPOModule(model=vllm_model_dir, reward_fns=[CharacterFractionReward("abcdefghijklmnopqrstuvwxyz")],
                              max_new_tokens=6, alpha=0.01, lr=1e-2, lr_scheduler="constant",
                              log_completions_every_n_steps=0, rollout=VLLMSampler(engine_kwargs={"max_model_len": 1024})),
                    engine)
    calls, generate = [], VLLMEngine.generate

    def counted(self, *args, **kwargs):
        calls.append(id(self))
        return generate(self, *args, **kwargs)

    if "generate" in vars(engine):  # an earlier test of the shared engine left its own wrapper on it
        monkeypatch.delattr(engine, "generate")
    monkeypatch.setattr(VLLMEngine, "generate", counted)
    ended = Ended()
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[ended],
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, prompt_loader(module.tokenizer, make_prompts(4, 0), 2))
    reference = module.rollout_source.for_model("reference").engine
    assert reference is not None and reference is not engine
    assert calls == [id(engine), id(reference)] * 2  # each rollout: the policy's responses, then the reference's, on vLLM
    assert engine.synced_step == 1 and reference.synced_step == 0  # the policy reloaded, the frozen reference never
    for rollout, _ in ended.rollouts:
        assert rollout.num_rows == 4 and rollout.sampler_logps is not None  # both models' rows: vLLM's log-probs
        assert (rollout.sampler_logps[1::2] != 0).any()
    reference.llm.llm_engine.engine_core.shutdown()  # the reference's core now, not whenever it is collected
    assert live_in_process_engines() == engines  # the session's engine, and the distributed state it uses, stay
