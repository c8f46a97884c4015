"""`main.py fit --config` with a multi-turn environment: GRPO and PPO on the tiny model (a
turn-taking environment and the calculator tool environment), and an exact resume after a
SIGTERM in the middle of a training step."""

from __future__ import annotations

import pytest
import torch

from callbacks import default_callbacks
from lit_rlhf.cli import main
from tests.helpers import write_config
from tests.modules.test_ppo_cli import scalar_tags
from tests.resume.harness import checkpoint_values

pytestmark = pytest.mark.usefixtures("one_thread")

COUNTING = {"class_path": "tests.envs.turn_envs.CountingEnv", "init_args": {"turns": 3, "reward_scale": 1.0}}


def config(root, model, method: str = "grpo", max_steps: int = 2, signal_marker=None, **module_args) -> dict:
    callbacks = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                  "init_args": {"dirpath": str(root / "checkpoints"), "save_last": True, "save_top_k": 0,
                                "every_n_train_steps": 1}}]
    if signal_marker is not None:  # SIGTERM in the backward pass of the first training step
        callbacks.append({"class_path": "tests.helpers.SignalOnce", "init_args": {"marker": str(signal_marker),
                                                                                  "step": 0}})
    environment = module_args.pop("environment", COUNTING)
    rollout = {"class_path": "lit_rlhf.online.EnvironmentRollouts",
               "init_args": {"environment": environment, "max_turns": 3, "max_episode_tokens": 128,
                             **module_args.pop("rollout_args", {})}}
    common = dict(model=str(model), max_new_tokens=6, rollout=rollout, micro_batch_size=2,
                  lr=1e-3, lr_scheduler="constant", log_completions_every_n_steps=1,
                  )
    if method == "grpo":
        model_cfg = {"class_path": "lit_rlhf.modules.GRPOModule",
                     "init_args": {**common, "num_generations": 2, "kl_coef": 0.04, **module_args}}
    else:
        model_cfg = {"class_path": "lit_rlhf.modules.PPOModule",
                     "init_args": {**common, "ppo_epochs": 2, "kl_coef": 0.05, **module_args}}
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "precision": "32", "max_steps": max_steps, "log_every_n_steps": 1,
            "enable_progress_bar": False, "enable_model_summary": False, "limit_val_batches": 0,
            "num_sanity_val_steps": 0, "deterministic": True,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(root / "tb"), "name": method, "version": ""}},
            "callbacks": callbacks,
        },
        "model": model_cfg,
        "data": {"class_path": "lit_rlhf.data.QADataModule",
                 "init_args": {"path": "bundled:arithmetic", "batch_size": 2, "limit": 6, "max_prompt_length": 128,
                               "val_split": None, "test_split": None}},
    }


def fit(root, model, *extra, **kwargs):
    root.mkdir(parents=True, exist_ok=True)
    path = write_config(root / "config.yaml", config(root, model, **kwargs))
    main(["fit", "--config", str(path), *extra], default_callbacks=default_callbacks)


@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_fit_on_a_multi_turn_environment(method, tmp_path, eos_prone_model):
    fit(tmp_path, eos_prone_model, method=method)
    scalars, texts = scalar_tags(tmp_path / "tb")
    for tag in ("train/rollout/turns", "train/rollout/policy_tokens", "train/rollout/env_tokens",
                "train/rollout/truncated_fraction", "train/rollout/tool_errors", "train/rewards/environment",
                "train/objective/kl", "train/policy/clipfrac"):
        assert tag in scalars, (tag, sorted(scalars))
    assert any(t.startswith("train/conversations") for t in texts), texts
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 2


TOOLS = {"class_path": "lit_rlhf.envs.ToolEnvironment",
         "init_args": {"tools": ["lit_rlhf.envs.calculator"], "prompt_column": "prompt", "timeout": 2.0,
                       "system_prompt": "Use the calculator.", "error_reward": -0.1}}


@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_fit_on_the_calculator_tool_environment(method, tmp_path, eos_prone_model):
    """The shipped recipe's shape: the calculator tool, MathAnswerReward, plain-text questions the
    environment renders with the tool's schema (vLLM: tests/vllm/test_env.py)."""
    fit(tmp_path, eos_prone_model, "--data.init_args.chat=false", "--data.init_args.prompt_template={question}",
        method=method, environment=TOOLS, reward_fns=[{"class_path": "lit_rlhf.rewards.MathAnswerReward"}])
    scalars, texts = scalar_tags(tmp_path / "tb")
    for tag in ("train/rollout/turns", "train/rollout/tool_calls", "train/rollout/tool_errors",
                "train/rewards/MathAnswerReward", "train/rewards/environment", "train/policy/clipfrac"):
        assert tag in scalars, (tag, sorted(scalars))
    assert any(t.startswith("train/conversations") for t in texts), texts
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def test_resume_mid_step_is_exact(tmp_path, eos_prone_model):
    """SIGTERM in the backward pass of the first training step: the step finishes, the
    preemption checkpoint is written after it and the run exits with 75; the resumed run runs
    the second step's episodes from the restored generators and data position (no environment
    state is saved: episodes start afresh each step), and ends with the straight run's final
    checkpoint, bitwise."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    fit(straight, eos_prone_model, max_steps=2)
    with pytest.raises(SystemExit) as stopped:
        fit(split, eos_prone_model, max_steps=2, signal_marker=split / "signalled")
    assert stopped.value.code == 75
    assert torch.load(split / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 1
    fit(split, eos_prone_model, "--ckpt_path", str(split / "checkpoints" / "last.ckpt"), max_steps=2,
        signal_marker=split / "signalled")
    a, b = checkpoint_values(straight / "checkpoints" / "last.ckpt"), checkpoint_values(split / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and a["global_step"] == 2
    assert not [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]


def test_an_environment_samples_in_the_step_and_a_method_must_opt_in(tmp_path, eos_prone_model):
    """Episodes run inside the training step: an asynchronous sampler is refused for their turns,
    before any sampling; and a method whose loss is not one trajectory per row (online DPO, ReMax)
    refuses the environment source at construction, in one line."""
    from lit_rlhf.envs import ToolEnvironment
    from lit_rlhf.modules import OnlineDPOModule, ReMaxModule
    from lit_rlhf.online import AsyncRollouts, EnvironmentRollouts
    from tests.envs.turn_envs import CountingEnv

    with pytest.raises(ValueError, match="its sampler must be HFSampler or VLLMSampler"):
        fit(tmp_path, eos_prone_model, rollout_args={"sampler": {"class_path": "lit_rlhf.online.AsyncRollouts"}})
    assert not (tmp_path / "checkpoints").exists()
    with pytest.raises(ValueError, match="its sampler must be HFSampler or VLLMSampler"):
        EnvironmentRollouts(CountingEnv(turns=3), sampler=AsyncRollouts(max_staleness=1))
    for cls in (OnlineDPOModule, ReMaxModule):
        with pytest.raises(ValueError, match=f"{cls.__name__} does not run environments"):
            cls(model="tiny-random-llama", rollout=EnvironmentRollouts(ToolEnvironment([])))
