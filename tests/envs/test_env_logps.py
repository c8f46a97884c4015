"""A multi-turn rollout through an online module: log-probs are the same on every log-prob path
(dense or chunked output layer, shared prompts or not, a LoRA policy), 0 off the policy's tokens."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.training.memory import Memory
from lit_rlhf.modules import GRPOModule
from lit_rlhf.online import EnvironmentRollouts
from tests.envs.conftest import make_eos_prone
from tests.envs.turn_envs import CountingEnv

pytestmark = pytest.mark.usefixtures("one_thread")


def batch(tokenizer):
    from lit_rlhf.data.collate import PromptCollator

    rows = [{"_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in ["2+2?", "hi"]]
    return PromptCollator(tokenizer.pad_token_id)(rows)


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8, "target_modules": "all-linear"}])
def test_multi_turn_logps_on_every_path(lora):
    torch.manual_seed(0)
    module = GRPOModule(rollout=EnvironmentRollouts(CountingEnv(turns=3), max_turns=3, max_episode_tokens=96), max_new_tokens=6,
                        num_generations=2, kl_coef=0.04, num_iterations=2, lora=lora, memory=Memory(logprob_chunk_size=None, shared_prompt=False))
    make_eos_prone(module.policy.get_base_model() if lora else module.policy, module.tokenizer)
    rollout, per_source, _ = module.make_rollout(batch(module.tokenizer), repeats=2)
    assert rollout.action_mask is not None and (rollout.response_attention_mask & ~rollout.action_mask).any()  # env tokens
    assert rollout.scores.shape == (4,) and "environment" in per_source
    off = ~rollout.loss_mask
    assert (rollout.logps[off] == 0).all() and (rollout.ref_logps[off] == 0).all()
    assert (rollout.logps[rollout.loss_mask] < 0).all()
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_attention_mask, 1.0)
    groups = torch.arange(4) // 2
    with torch.no_grad():
        reference = module.response_token_logps(module.policy, *args)  # dense, no sharing
        for chunk, shared in [(16, False), (None, True), (16, True)]:
            module.logprob_chunk_size, module.shared_prompt = chunk, shared
            other = module.response_token_logps(module.policy, *args, groups=groups)
            torch.testing.assert_close(other[rollout.loss_mask], reference[rollout.loss_mask], atol=2e-5, rtol=0)
