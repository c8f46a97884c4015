"""A multi-turn environment on the vLLM backend: the engine samples every turn from the whole
episode so far, the rollout keeps its ids as sampled, and its log-probs of the policy's tokens
agree with the trainer's."""

from __future__ import annotations

import math

import lightning as L
import torch

from lit_rlhf.modules import GRPOModule
from tests.envs.conftest import make_eos_prone
from tests.envs.turn_envs import CountingEnv
from tests.vllm.conftest import attach
from tests.vllm.test_fit import fit


def test_grpo_multi_turn_on_vllm(vllm_model_dir, engine, tmp_path):
    L.seed_everything(0)
    module = GRPOModule(model=vllm_model_dir, generation_backend="vllm", environment=CountingEnv(turns=3),
                        max_turns=3, max_new_tokens=6, max_episode_tokens=128, num_generations=2, kl_coef=0.04,
                        num_iterations=2, lr=1e-3, lr_scheduler="constant", log_completions_every_n_steps=0)
    make_eos_prone(module.policy, module.tokenizer)  # turns that end: several turns per episode
    module = attach(module, engine)
    seen = []
    generate = module.generate

    def recording(ids, mask, sampling):
        out = generate(ids, mask, sampling)
        seen.append(out)
        return out

    module.generate = recording
    _, metrics = fit(module, tmp_path, max_steps=4)
    assert len(metrics) == 2 and max(m["train/rollout/turns"] for m in metrics) > 1
    assert any(m["train/rollout/env_tokens"] > 0 for m in metrics)
    # trainer and sampler agree on the policy's tokens, sampled in their multi-turn context
    diffs = [m["train/rollout/sampler_logprob_diff_max"] for m in metrics]
    assert all(math.isfinite(d) and d < 1e-3 for d in diffs), diffs
    # the engine sampled every turn (more calls than rollouts) and reported its log-probs
    assert len(seen) > 2 and all(out[3] is not None and bool(torch.isfinite(out[3]).all()) for out in seen)
