"""`logprob_temperature`: the online methods sample at `temperature` and score every log-prob they
train on (rollout, reference, update) at `logprob_temperature`, by default the same."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.modules import GRPOModule, PPOModule, RLOOModule
from lit_rlhf.rewards import CharacterFractionReward

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPTS = ["hello there", "what is", "tell me a story", "x"]
SETTINGS = dict(model="tiny-random-llama", reward_fns=[CharacterFractionReward()], max_new_tokens=4,
                log_completions_every_n_steps=0, lr_scheduler="constant")


def prompt_loader(tokenizer):
    rows = [{"_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in PROMPTS]
    return DataLoader(rows, batch_size=2, collate_fn=PromptCollator(tokenizer.pad_token_id))


def test_the_log_prob_temperature_defaults_to_the_sampling_temperature():
    module = GRPOModule(temperature=0.7, kl_coef=0.0, **SETTINGS)
    assert module.logprob_temperature == 0.7 and module.sampling.temperature == 0.7
    module = GRPOModule(temperature=0.7, logprob_temperature=1.0, kl_coef=0.0, **SETTINGS)
    assert module.logprob_temperature == 1.0 and module.sampling.temperature == 0.7
    assert module.hparams["logprob_temperature"] == 1.0
    with pytest.raises(ValueError, match="logprob_temperature must be > 0"):
        GRPOModule(logprob_temperature=0.0, kl_coef=0.0, **SETTINGS)


def test_the_rollout_is_scored_at_the_log_prob_temperature():
    L.seed_everything(0)
    module = GRPOModule(temperature=0.5, logprob_temperature=1.0, num_generations=2, num_iterations=2, **SETTINGS)
    batch = next(iter(prompt_loader(module.tokenizer)))
    rollout, _, _ = module.make_rollout(batch, 2)
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_attention_mask)
    with torch.no_grad():
        at_one = module.response_token_logps(module.policy, *args, 1.0)
        at_half = module.response_token_logps(module.policy, *args, 0.5)
    mask = rollout.response_attention_mask
    torch.testing.assert_close(rollout.logps[mask], at_one[mask])
    torch.testing.assert_close(rollout.ref_logps[mask], at_one[mask])  # the reference is the initial policy
    assert not torch.allclose(rollout.logps[mask], at_half[mask])


@pytest.mark.parametrize("cls", [GRPOModule, RLOOModule, PPOModule])
def test_every_log_prob_of_a_step_is_at_the_log_prob_temperature(cls, tmp_path, monkeypatch):
    temperatures = []
    real = cls.response_token_logps

    def recording(self, model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=1.0, *args, **kwargs):
        temperatures.append(temperature)
        return real(self, model, prompt_ids, prompt_mask, response_ids, response_mask, temperature, *args, **kwargs)

    monkeypatch.setattr(cls, "response_token_logps", recording)
    L.seed_everything(0)
    extra = {"num_iterations": 2} if cls is GRPOModule else {}  # old log-probs in the rollout, then two passes
    module = cls(temperature=0.5, logprob_temperature=1.0, num_generations=2, **extra, **SETTINGS) if cls is not PPOModule \
        else cls(temperature=0.5, logprob_temperature=1.0, ppo_epochs=1, **SETTINGS)
    trainer = L.Trainer(max_steps=module.updates_per_rollout(), accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(tmp_path),
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        log_every_n_steps=1)
    trainer.fit(module, prompt_loader(module.tokenizer))
    assert temperatures and set(temperatures) == {1.0}, temperatures  # rollout, reference and update alike
    if cls is GRPOModule:  # the update's first pass reproduces the rollout's log-probs: ratio exactly 1 (D7)
        assert float(trainer.callback_metrics["train/policy/first_ratio_mean"]) == 1.0
