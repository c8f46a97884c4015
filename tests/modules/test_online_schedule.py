"""Online methods: the learning rate annealed per rollout (the N+ reference code) or per
optimizer step, and validation responses sampled at their own temperature (N+: 0.01)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning import Callback

import lit_rlhf.online.sources as online_rollout
from lit_rlhf.modules import GRPOModule
from lit_rlhf.rewards import CharacterFractionReward
from tests.modules.test_grpo import prompt_loader


class LearningRates(Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])


def fit(tmp_path, monkeypatch, **kwargs):
    temperatures = []
    generate = online_rollout.generate_responses

    def recording(policy, prompt_ids, prompt_mask, sampling, *args, **kw):
        temperatures.append(sampling.temperature)
        return generate(policy, prompt_ids, prompt_mask, sampling, *args, **kw)

    monkeypatch.setattr(online_rollout, "generate_responses", recording)
    torch.set_num_threads(1)
    L.seed_everything(0)
    module = GRPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward("abc")], num_generations=2,
                        max_new_tokens=4, num_iterations=2, lr=1e-3, lr_scheduler="linear", total_episodes=48,
                        temperature=0.7, **kwargs)
    lrs = LearningRates()
    trainer = L.Trainer(max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[lrs],
                        limit_val_batches=1, check_val_every_n_epoch=None, val_check_interval=3, num_sanity_val_steps=0)
    loader = prompt_loader(module.tokenizer, batch_size=8)
    trainer.fit(module, loader, prompt_loader(module.tokenizer, batch_size=2))
    return lrs.lrs, temperatures


def test_lr_annealed_once_per_rollout(tmp_path, monkeypatch):
    # 48 episodes = 3 rollouts of 8 prompts x 2; 2 updates each; linear decay over 3 rollouts
    lrs, _ = fit(tmp_path, monkeypatch, lr_schedule_per="rollout")
    assert lrs == pytest.approx([1e-3, 1e-3, 2e-3 / 3, 2e-3 / 3, 1e-3 / 3, 1e-3 / 3])


def test_lr_annealed_per_optimizer_step_and_validation_temperature(tmp_path, monkeypatch):
    lrs, temperatures = fit(tmp_path, monkeypatch, val_temperature=0.01)
    assert lrs == pytest.approx([1e-3 * (1 - k / 6) for k in range(6)])
    assert temperatures == [0.7, 0.7, 0.7, 0.01]  # 3 rollouts, then validation after the third
