"""PPOModule: first ratio exactly 1, reward at EOS, D22 value init, learning on the tiny model."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

import lit_rlhf.modules.ppo as ppo_module
from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.models import ScalarHeadModel, backbone_of, load_causal_lm, load_scalar_model
from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import CharacterFractionReward, reward_model_scores
from lit_rlhf.types import Rollout

PROMPTS = ["hello there", "what is", "tell me a story", "x", "abc", "The cat", "Q: 2+2?", "once"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def prompt_loader(tokenizer, prompts=PROMPTS, batch_size=8):
    rows = [{"_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in prompts]
    return DataLoader(rows, batch_size=batch_size, shuffle=True, collate_fn=PromptCollator(tokenizer.pad_token_id))


def trainer(tmp_path, **kwargs):
    defaults = dict(
        max_epochs=-1, accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(tmp_path), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
    )
    return L.Trainer(**{**defaults, **kwargs})


def read_metrics(tmp_path):
    import csv

    (path,) = list(tmp_path.rglob("metrics.csv"))
    rows = list(csv.DictReader(path.open()))
    return [{k: float(v) for k, v in row.items() if v != ""} for row in rows]


def test_first_minibatch_ratio_is_exactly_one(tmp_path, monkeypatch):
    seen = []
    real = ppo_module.ppo_policy_loss

    def recording(logps, old_logps, advantages, mask, clip_eps=0.2):
        seen.append((logps.detach().clone(), old_logps.clone(), mask.clone()))
        return real(logps, old_logps, advantages, mask, clip_eps)

    monkeypatch.setattr(ppo_module, "ppo_policy_loss", recording)
    L.seed_everything(0)
    module = PPOModule(
        model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], max_new_tokens=6, lr=1e-2,
        ppo_epochs=2, num_minibatches=2, micro_batch_size=2, total_episodes=8, lr_scheduler="constant",
    )
    trainer(tmp_path).fit(module, prompt_loader(module.tokenizer))
    assert len(seen) == 2 * 2 * 2  # epochs x minibatches x micro-batches
    logps, old, mask = seen[0]
    assert mask.any()
    assert torch.equal(logps[mask], old[mask])  # bitwise: ratio exactly 1 (D7, no dropout)
    assert read_metrics(tmp_path)[-1]["train/policy/first_ratio_mean"] == 1.0
    # after a step with lr 1e-2 the policy has moved: later minibatches see ratio != 1
    later_logps, later_old, later_mask = seen[-1]
    assert not torch.equal(later_logps[later_mask], later_old[later_mask])
    assert module.episodes == 8 and module.rollouts == 1


def test_reward_model_is_read_at_the_eos_token(tiny_tokenizer):
    tok = tiny_tokenizer
    reward_model = ScalarHeadModel(backbone_of(load_causal_lm("tiny-random-llama", tok))).eval()
    pad, eos = tok.pad_token_id, tok.eos_token_id
    prompt_ids = torch.tensor([[pad, 10, 11], [12, 13, 14], [pad, pad, 15]])
    prompt_mask = prompt_ids != pad
    # EOS first, EOS in the middle, no EOS (cut, PAD-filled as generate_responses returns them)
    response_ids = torch.tensor([[eos, pad, pad, pad], [20, 21, eos, pad], [22, 23, 24, 25]])
    response_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    rollout = Rollout(prompt_ids, prompt_mask, response_ids, response_mask, torch.tensor([True, True, False]),
                      torch.zeros(3, 4))
    scores = reward_model_scores(reward_model, rollout.input_ids, rollout.attention_mask)
    with torch.no_grad():
        values = reward_model(rollout.input_ids, rollout.attention_mask)  # (3, P+R)
    eos_positions = [3 + 0, 3 + 2, 3 + 3]
    torch.testing.assert_close(scores, values[torch.arange(3), eos_positions])
    # micro-batched scoring is the same
    torch.testing.assert_close(reward_model_scores(reward_model, rollout.input_ids, rollout.attention_mask, 1), scores)


def test_value_model_starts_from_the_reward_model(tmp_path, tiny_tokenizer):
    """D22: with `value_model` unset, the value model is a trained copy of the reward model."""
    from lit_rlhf.modules import RewardModule

    RewardModule(model="tiny-random-llama").export_hf(tmp_path / "rm")
    module = PPOModule(model="tiny-random-llama", reward_model=str(tmp_path / "rm"), max_new_tokens=4)
    reference = load_scalar_model(str(tmp_path / "rm"), tiny_tokenizer)
    torch.testing.assert_close(module.value_model.head.weight, reference.head.weight)
    torch.testing.assert_close(module.reward_model.head.weight, reference.head.weight)
    assert module.value_model is not module.reward_model
    assert all(p.requires_grad for p in module.value_model.parameters())
    assert not any(p.requires_grad for p in module.reward_model.parameters())
    # one optimizer, the value model in it; frozen models are not
    groups = module.optimizer_param_groups()
    params = {id(p) for g in groups for p in g["params"]}
    assert all(id(p) in params for p in module.value_model.parameters())
    assert not any(id(p) in params for p in module.reward_model.parameters())
    assert not any(id(p) in params for p in module.ref_model.parameters())


def test_bad_configuration_is_named():
    with pytest.raises(ValueError, match="no reward source"):
        PPOModule(model="tiny-random-llama")
    with pytest.raises(ValueError, match="reward_weights has 2 entries for 1"):
        PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward()], reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="kl_estimator"):
        PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward()], kl_estimator="k9")


def test_ppo_raises_the_reward(tmp_path):
    """Reward = fraction of lowercase letters in an 8-token completion; 40 rollouts of 8 prompts.

    Measured (seed 0): mean score of the first 5 rollouts 0.107, of the last 5 0.563.
    """
    L.seed_everything(0)
    module = PPOModule(
        model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], max_new_tokens=8, temperature=1.0,
        lr=1e-3, lr_scheduler="constant", kl_coef=0.01, ppo_epochs=2, num_minibatches=2, micro_batch_size=4,
        total_episodes=8 * 40,
    )
    trainer(tmp_path).fit(module, prompt_loader(module.tokenizer))
    metrics = [m for m in read_metrics(tmp_path) if "train/objective/scores" in m]
    assert len(metrics) == 40
    scores = [m["train/objective/scores"] for m in metrics]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    print(f"mean score first 5 rollouts {first:.3f}, last 5 {last:.3f}")
    assert last > first + 0.1, (first, last)
    kls = [m["train/objective/kl"] for m in metrics]
    assert metrics[0]["train/objective/kl"] == 0.0  # the reference is the initial policy
    assert all(math.isfinite(k) for k in kls) and max(abs(k) for k in kls) < 50
    for name in ("policy/clipfrac", "policy/approxkl", "value/vpred", "value/error", "value/clipfrac",
                 "policy/ratio_mean", "policy/ratio_var", "objective/entropy", "objective/rlhf_reward",
                 "response/length", "response/eos_fraction", "time/generation", "time/update", "perf/tokens_per_sec"):
        assert all(math.isfinite(m[f"train/{name}"]) for m in metrics), name


def test_make_rollout_without_a_trainer_and_bad_rewards_are_named(tiny_tokenizer):
    def nan_reward(prompts, completions, **columns):
        return [float("nan")] * len(completions)

    def weights_seen(prompts, completions, **columns):
        assert columns["prompt"] == prompts  # batch columns are passed through, row-aligned
        return [2.0] * len(completions)

    L.seed_everything(0)
    batch = next(iter(prompt_loader(tiny_tokenizer, batch_size=3)))
    module = PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(), weights_seen],
                       reward_weights=[0.0, 0.5], max_new_tokens=5)
    rollout, per_source, _ = module.make_rollout(batch)
    assert rollout.response_ids.shape == (3, 5) and rollout.values.shape == (3, 5)
    assert rollout.ref_logps is not None
    torch.testing.assert_close(rollout.logps, rollout.ref_logps)  # the reference is the initial policy
    assert rollout.scores.tolist() == [1.0, 1.0, 1.0]  # 0 * fraction + 0.5 * 2
    assert set(per_source) == {"CharacterFractionReward", "weights_seen"}
    module.reward_fns = [nan_reward]
    module.reward_weights = None
    with pytest.raises(ValueError, match="nan_reward.*non-finite"):
        module.make_rollout(batch)
