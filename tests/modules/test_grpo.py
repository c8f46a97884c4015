"""GRPOModule: learning on the tiny model, kl_coef 0 without a reference, zero-variance groups, hooks
(on a subclass that replaces the advantages: `tests.modules.pinned.LeaveOneOutGRPO`)."""

from __future__ import annotations

import csv
import math

import lightning as L
import pytest
import torch
from lightning import Callback
from torch.utils.data import DataLoader

from callbacks import EOSTrickCallback, KLControlCallback
from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.modules import GRPOModule
from lit_rlhf.rewards import CharacterFractionReward
from tests.modules.pinned import LeaveOneOutGRPO

PROMPTS = ["hello there", "what is", "tell me a story", "x", "abc", "The cat", "Q: 2+2?", "once"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def prompt_loader(tokenizer, batch_size=4):
    rows = [{"_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in PROMPTS]
    return DataLoader(rows, batch_size=batch_size, shuffle=True, collate_fn=PromptCollator(tokenizer.pad_token_id))


def fit(module, tmp_path, callbacks=()):
    trainer = L.Trainer(
        max_epochs=-1, accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(tmp_path), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, callbacks=list(callbacks),
    )
    trainer.fit(module, prompt_loader(module.tokenizer))
    (path,) = list(tmp_path.rglob("metrics.csv"))
    rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(path.open())]
    return trainer, [r for r in rows if "train/objective/scores" in r]


def constant_reward(prompts, completions, **columns):
    return [0.5] * len(completions)


def test_grpo_raises_the_reward(tmp_path):
    """Reward = fraction of lowercase letters; 4 prompts x G=4 completions of 8 tokens, 30 rollouts.

    Measured (seed 0): mean score of the first 5 rollouts 0.108, of the last 5 0.307.
    """
    L.seed_everything(0)
    module = GRPOModule(
        model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], num_generations=4,
        max_new_tokens=8, lr=1e-3, lr_scheduler="constant", kl_coef=0.01, num_iterations=2, total_episodes=16 * 30,
    )
    _, metrics = fit(module, tmp_path)
    assert len(metrics) == 30
    scores = [m["train/objective/scores"] for m in metrics]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    print(f"mean score first 5 rollouts {first:.3f}, last 5 {last:.3f}")
    assert last > first + 0.1, (first, last)
    assert metrics[0]["train/objective/kl"] == 0.0
    assert all(math.isfinite(m["train/objective/kl"]) and math.isfinite(m["train/objective/kl_loss"]) for m in metrics)
    assert all(m["train/objective/kl_loss"] >= 0 for m in metrics)  # k3 is non-negative
    for name in ("rewards/group_std", "rewards/zero_std_fraction", "policy/clipfrac", "policy/ratio_mean",
                 "response/length", "time/generation", "time/update"):
        assert all(math.isfinite(m[f"train/{name}"]) for m in metrics), name


def test_beta_zero_skips_the_reference_and_equal_rewards_give_zero_advantage(tmp_path):
    L.seed_everything(0)
    module = GRPOModule(
        model="tiny-random-llama", reward_fns=[constant_reward], num_generations=2, max_new_tokens=4, kl_coef=0.0,
        lr=1e-2, total_episodes=8,
    )
    assert not hasattr(module, "ref_model")
    before = [p.detach().clone() for p in module.policy.parameters()]
    _, metrics = fit(module, tmp_path)
    (m,) = metrics
    assert m["train/rewards/zero_std_fraction"] == 1.0
    assert m["train/rewards/group_std"] == 0.0
    assert m["train/advantages/abs_mean"] == 0.0
    assert m["train/policy/loss"] == 0.0
    assert "train/objective/kl" not in m  # no reference, no KL
    # zero advantages and no KL term: zero gradients, and AdamW with zero gradients does not move
    assert all(torch.equal(a, b) for a, b in zip(before, module.policy.parameters()))


def test_rollout_hooks_run_in_callback_order_and_shape_the_scores(tmp_path):
    calls = []

    class Recorder(Callback):
        def __init__(self, name):
            self.name = name

        def on_rollout_scores(self, trainer, pl_module, rollout):
            calls.append((self.name, rollout.scores.clone()))
            return rollout.with_scores(rollout.scores + 1.0)

    L.seed_everything(0)
    module = LeaveOneOutGRPO(
        model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], num_generations=2,
        max_new_tokens=3, total_episodes=8,
    )
    kl = KLControlCallback(init_kl_coef=0.2, target=1.0, horizon=10)
    _, metrics = fit(module, tmp_path, [Recorder("first"), EOSTrickCallback(score=-3.0), Recorder("second"), kl])
    (m,) = metrics
    assert [name for name, _ in calls] == ["first", "second"]
    first_seen, second_seen = calls[0][1], calls[1][1]
    # 3 tokens from a random model rarely end in EOS: the EOS trick replaced the +1-shifted scores
    assert m["train/eos_trick/penalized"] == float((second_seen == -3.0).sum())
    assert m["train/eos_trick/penalized"] > 0
    assert m["train/objective/scores"] == pytest.approx(float((second_seen + 1.0).mean()), abs=1e-6)
    assert torch.all((second_seen == -3.0) | (second_seen == first_seen + 1.0))
    # the KL controller drove GRPO's kl_coef
    assert m["train/objective/kl_coef"] == pytest.approx(0.2)
    assert module.kl_coef == pytest.approx(kl.kl_coef) and module.kl_coef != 0.2


def test_bad_configuration_is_named():
    with pytest.raises(ValueError, match="num_generations"):
        GRPOModule(model="tiny-random-llama", reward_fns=[constant_reward], num_generations=1)
    with pytest.raises(ValueError, match="aggregation"):
        GRPOModule(model="tiny-random-llama", reward_fns=[constant_reward], aggregation="sum")
    with pytest.raises(ValueError, match="scale"):
        GRPOModule(model="tiny-random-llama", reward_fns=[constant_reward], scale="std")
