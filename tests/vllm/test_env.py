"""A multi-turn environment on the vLLM backend: the engine samples every turn from the whole
episode so far, the rollout keeps its ids as sampled, and its log-probs of the policy's tokens
agree with the trainer's; GRPO and PPO on the calculator tool environment through `main.py fit
--config` (the session's engine lent to the CLI's module: one engine per test process)."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lit_rlhf.modules import GRPOModule
from lit_rlhf.online import EnvironmentRollouts, VLLMSampler
from tests.envs.conftest import make_eos_prone
from tests.envs.test_env_fit import TOOLS, config
from tests.helpers import write_config
from tests.vllm.test_server import tb_scalars
from tests.envs.turn_envs import CountingEnv
from tests.vllm.conftest import attach
from tests.vllm.test_fit import fit


def test_grpo_multi_turn_on_vllm(vllm_model_dir, engine, tmp_path):
    L.seed_everything(0)
    rollout = EnvironmentRollouts(CountingEnv(turns=3), max_turns=3, max_episode_tokens=128, sampler=VLLMSampler())
    module = GRPOModule(model=vllm_model_dir, rollout=rollout, max_new_tokens=6, num_generations=2, kl_coef=0.04,
                        num_iterations=2, lr=1e-3, lr_scheduler="constant", log_completions_every_n_steps=0)
    make_eos_prone(module.policy, module.tokenizer)  # turns that end: several turns per episode
    module = attach(module, engine)
    seen = []
    sampler = module.rollout_source.sampler  # every policy turn of an episode
    generate = sampler.generate

    def recording(owner, ids, mask, sampling):
        out = generate(owner, ids, mask, sampling)
        seen.append(out)
        return out

    sampler.generate = recording
    _, metrics = fit(module, tmp_path, max_steps=4)
    assert len(metrics) == 2 and max(m["train/rollout/turns"] for m in metrics) > 1
    assert any(m["train/rollout/env_tokens"] > 0 for m in metrics)
    # trainer and sampler agree on the policy's tokens, sampled in their multi-turn context
    diffs = [m["train/rollout/sampler_logprob_diff_max"] for m in metrics]
    assert all(math.isfinite(d) and d < 1e-3 for d in diffs), diffs
    # the engine sampled every turn (more calls than rollouts) and reported its log-probs
    assert len(seen) > 2 and all(out[3] is not None and bool(torch.isfinite(out[3]).all()) for out in seen)


class SessionEngine(Callback):
    """Lends `SessionEngine.engine` (the session's) to the CLI's module before its first rollout."""

    engine = None

    def setup(self, trainer, pl_module, stage):
        attach(pl_module, SessionEngine.engine)


@pytest.fixture(scope="module")
def eos_prone_vllm_model(vllm_model_dir, tmp_path_factory):
    """The engine's tiny model, made to end its turns (`make_eos_prone`), as a model directory."""
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(vllm_model_dir)
    model = make_eos_prone(load_causal_lm(vllm_model_dir, tokenizer, dtype="float32"), tokenizer)
    path = tmp_path_factory.mktemp("eos_prone_vllm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_tool_environment_through_the_cli_on_vllm(method, eos_prone_vllm_model, engine, tmp_path, monkeypatch):
    """The shipped recipe's shape (calculator tool, MathAnswerReward, plain-text questions the
    environment renders) with `generation_backend: vllm`: two steps train, the episodes' turns,
    tokens and tool calls are logged, and the engine's log-probs of the policy's tokens match the
    trainer's. (A random model opens no call, so its episodes end after one turn: several turns on
    vLLM are `test_grpo_multi_turn_on_vllm`'s.)"""
    from callbacks import default_callbacks
    from lit_rlhf.cli import main

    monkeypatch.setattr(SessionEngine, "engine", engine)
    cfg = config(tmp_path, eos_prone_vllm_model, method=method, environment=TOOLS,
                 rollout_args={"sampler": {"class_path": "lit_rlhf.online.VLLMSampler"}},
                 reward_fns=[{"class_path": "lit_rlhf.rewards.MathAnswerReward"}])
    cfg["trainer"]["callbacks"].append({"class_path": "tests.vllm.test_env.SessionEngine"})
    cfg["data"]["init_args"].update(chat=False, prompt_template="{question}")
    main(["fit", "--config", str(write_config(tmp_path / "config.yaml", cfg))], default_callbacks=default_callbacks)
    scalars = tb_scalars(tmp_path / "tb")
    for tag in ("train/rollout/turns", "train/rollout/policy_tokens", "train/rollout/env_tokens",
                "train/rollout/tool_calls", "train/rollout/tool_errors", "train/rewards/MathAnswerReward"):
        assert tag in scalars, (tag, sorted(scalars))
    diffs = scalars["train/rollout/sampler_logprob_diff_max"]
    assert all(math.isfinite(d) and d < 1e-3 for d in diffs), diffs
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
