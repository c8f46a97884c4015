"""The rollout correction wired into the online methods (`lit_rlhf.online.correction`): with
matched engines (the sampler's log-probs are the learner's) turning it on changes nothing,
bitwise; a mismatch is weighed and masked through `OnlineModule.tis_weights`; the mismatch is
logged correction on or off; the sources take a `correction` (or `tis_cap`, its shorthand) and
refuse what does not fit; an end-to-end CLI fit of GRPO on asynchronous rollouts with one."""

from __future__ import annotations

import csv
import math

import lightning as L
import pytest
import torch
import yaml

from lit_rlhf.cli import main
from lit_rlhf.modules import GRPOModule, GSPOModule, OnlineDPOModule, PPOModule, RLOOModule
from lit_rlhf.online import AsyncRollouts, HFSampler, RolloutCorrection, VLLMSampler
from lit_rlhf.rewards import CharacterFractionReward
from lit_rlhf.types import Rollout
from tests.modules.test_grpo import LETTERS, fit

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class MatchedSampler(HFSampler):
    """Our sampler, reporting as the sampler's log-probs the learner's own, computed exactly as the
    rollout's scoring computes them (so every ratio is exactly 1): matched engines."""

    def __init__(self, correction: RolloutCorrection | None = None, shift: float = 0.0) -> None:
        self.correction, self.shift = correction, shift  # shift: subtracted from the sampler's log-probs

    learner = None  # the module that trains on these samples (set by `run`): its scoring is copied

    def sample(self, model, batch, repeats, sampling, training=True):
        rollout, stats = super().sample(model, batch, repeats, sampling, training)
        groups = torch.arange(rollout.num_rows) // repeats if repeats > 1 else None
        module = self.learner
        with torch.no_grad():
            logps = module.response_token_logps(module.policy, rollout.prompt_ids, rollout.prompt_mask,
                                                rollout.response_ids, rollout.response_attention_mask,
                                                module.logprob_temperature, module.micro_batch_size, groups)
        return rollout._replace(sampler_logps=rollout.on_policy_tokens(logps - self.shift)), stats


def run(cls, source, path):
    L.seed_everything(0)
    options = {PPOModule: {"ppo_epochs": 2}, RLOOModule: {"num_generations": 2}}.get(
        cls, {"num_generations": 2, "num_iterations": 2})  # GRPO's old log-probs from the rollout
    module = cls(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], max_new_tokens=4, lr=1e-3, lr_scheduler="constant", kl_coef=0.0, total_episodes=16, rollout=source,
                 **options)
    if isinstance(module.rollout_source, MatchedSampler):
        module.rollout_source.learner = module
    initial = [p.detach().clone() for p in module.policy.parameters()]
    _, metrics = fit(module, path)
    assert any(not torch.equal(a, b) for a, b in zip(initial, module.policy.parameters()))  # it trained
    return module, metrics


CORRECTIONS = {
    "token_truncate": RolloutCorrection("truncate", "token", 2.0),
    "token_mask": RolloutCorrection("mask", "token", 1.5, 0.5),
    "sequence_mask": RolloutCorrection("mask", "sequence", 1.001),
    "geometric_truncate_offpolicy": RolloutCorrection("truncate", "geometric", 1.0, offpolicy_kl=0.0),
}


@pytest.mark.parametrize("cls", [GRPOModule, GSPOModule, RLOOModule, PPOModule], ids=lambda c: c.__name__)
def test_matched_engines_change_nothing(tmp_path, cls):
    plain, plain_metrics = run(cls, MatchedSampler(None), tmp_path / "off")
    assert plain_metrics[-1]["train/rollout_correction/kl_k1"] == 0.0  # logged with the correction off too
    assert plain_metrics[-1]["train/rollout_correction/ratio_max"] == 1.0
    for name, correction in CORRECTIONS.items():
        corrected, metrics = run(cls, MatchedSampler(correction), tmp_path / name)
        for a, b in zip(plain.policy.parameters(), corrected.policy.parameters()):
            assert torch.equal(a, b), name
        assert all(m["train/rollout_correction/masked_fraction"] == 0.0 for m in metrics), name
        assert all(m["train/rollout_correction/kl_k3"] == 0.0 for m in metrics), name


@pytest.mark.parametrize("cls", [GRPOModule, GSPOModule, RLOOModule, PPOModule], ids=lambda c: c.__name__)
def test_a_mismatch_is_corrected_in_the_update(tmp_path, cls):
    # the sampler's log-probs 1 below the learner's on every token: w_t = e = 2.72 > 2, every token dropped
    _, plain = run(cls, MatchedSampler(None, shift=1.0), tmp_path / "off")
    assert any(m["train/policy/loss"] != 0.0 for m in plain)
    assert all(m["train/rollout_correction/kl_k1"] == pytest.approx(-1.0) for m in plain)
    dropped = RolloutCorrection("mask", "token", 2.0)
    with pytest.raises(AssertionError):  # nothing trains: every policy-gradient term weighs 0
        run(cls, MatchedSampler(dropped, shift=1.0), tmp_path / "on")
    _, metrics = run(cls, MatchedSampler(dropped, shift=0.5), tmp_path / "kept")  # w = e^0.5 = 1.65: kept
    assert all(m["train/rollout_correction/masked_fraction"] == 0.0 for m in metrics)


def hand_rollout(shift: float) -> Rollout:
    """Two rows of 3 tokens (the second padded after 2) whose sampler log-probs are the
    learner's (all -1) minus `shift` on row 0."""
    ids = torch.tensor([[5, 6, 7], [5, 6, 0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    sampler = torch.tensor([[-1.0 - shift] * 3, [-1.0, -1.0, 0.0]])
    return Rollout(torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool), ids, mask,
                   torch.tensor([False, True]), None, sampler_logps=sampler)


def test_tis_weights_apply_the_source_correction():
    module = GRPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], kl_coef=0.0,
                        rollout=AsyncRollouts(max_staleness=1, correction={"mode": "mask", "level": "sequence",
                                                                           "upper": 2.0, "offpolicy_kl": 0.2}))
    train, rows = torch.full((2, 3), -1.0), torch.arange(2)
    # row 0: log-ratio 0.1 a token, 0.3 a sequence -> w = e^0.3 = 1.35 kept; row 1: w = 1
    w = module.tis_weights(hand_rollout(0.1), rows, train, torch.tensor([1.0, -1.0]))
    assert torch.allclose(w, torch.tensor([[math.exp(0.3)] * 3, [1.0, 1.0, 0.0]]))
    # row 0: 0.3 a token, 0.9 a sequence -> w = e^0.9 = 2.46 > 2: dropped
    assert torch.equal(module.tis_weights(hand_rollout(0.3), rows, train, torch.ones(2))[0], torch.zeros(3))
    # row 0: -0.3 a token, -0.9 a sequence -> w = e^-0.9 = 0.41 < 1/2 (the lower bound 1 / upper): dropped
    assert module.tis_weights(hand_rollout(-0.3), rows, train, torch.ones(2))[0].tolist() == [0.0] * 3
    # the off-policy sequence mask: row 0's KL is mean(sampler - learner) = 0.3 > 0.2; dropped only when A < 0
    loose = GRPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], kl_coef=0.0,
                       rollout=AsyncRollouts(correction=RolloutCorrection("truncate", "geometric", 2.0, None, 0.2)))
    kept = loose.tis_weights(hand_rollout(-0.3), rows, train, torch.tensor([1.0, -1.0]))
    assert torch.allclose(kept[0], torch.full((3,), math.exp(-0.3)))
    dropped = loose.tis_weights(hand_rollout(-0.3), rows, train, torch.tensor([-1.0, -1.0]))
    assert torch.equal(dropped[0], torch.zeros(3)) and torch.equal(dropped[1], torch.tensor([1.0, 1.0, 0.0]))
    assert loose.tis_weights(hand_rollout(0.0)._replace(sampler_logps=None), rows, train) is None


def test_sources_take_a_correction_or_its_shorthand():
    assert VLLMSampler(tis_cap=3.0).correction == RolloutCorrection("truncate", "token", 3.0)
    assert VLLMSampler(tis_cap=3.0).tis_cap == 3.0 and VLLMSampler().correction is None
    assert AsyncRollouts(max_staleness=1).correction == RolloutCorrection("truncate", "token", 2.0)
    assert AsyncRollouts(max_staleness=0).correction is None and AsyncRollouts(tis_cap=0).correction is None
    masked = AsyncRollouts(correction={"mode": "mask", "level": "geometric", "lower": 0.9, "upper": 1.1})
    assert masked.correction.level == "geometric" and masked.tis_cap is None
    with pytest.raises(ValueError, match="not both"):
        VLLMSampler(tis_cap=2.0, correction=RolloutCorrection())
    with pytest.raises(ValueError, match="lower"):
        RolloutCorrection("truncate", "token", 2.0, 0.5)
    with pytest.raises(ValueError, match="has no rollout correction"):
        OnlineDPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)],
                        rollout=AsyncRollouts(correction=RolloutCorrection("mask")))
    GSPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)],
               rollout=AsyncRollouts(max_staleness=1, correction=RolloutCorrection("mask", "geometric", 1.01)))
    with pytest.raises(TypeError, match="moved: use VLLMSampler.tis_cap=.... or AsyncRollouts.tis_cap=....* correction"):
        GRPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], tis_cap=2.0)


def test_cli_fit_grpo_with_a_correction_on_async_rollouts(tmp_path):
    """Also GRPO's entropy control (covariance and bonus) from YAML (a target far above the entropy)."""
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "precision": "32", "max_epochs": -1, "log_every_n_steps": 1,
                    "limit_val_batches": 0, "num_sanity_val_steps": 0, "enable_checkpointing": False,
                    "enable_progress_bar": False, "enable_model_summary": False,
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(tmp_path)}}},
        "model": {"class_path": "lit_rlhf.modules.GRPOModule", "init_args": {
            "model": "tiny-random-llama", "dtype": "float32",
            "reward_fns": [{"class_path": "lit_rlhf.rewards.CharacterFractionReward"}],
            "num_generations": 2, "max_new_tokens": 4, "kl_coef": 0.0, "lr": 1.0e-3, "total_episodes": 12,
            "entropy": {"covariance": {"method": "clip_cov"},
                        "bonus": {"coef": 0.001, "target": 20.0, "step": 0.001}},
            "rollout": {"class_path": "lit_rlhf.online.AsyncRollouts", "init_args": {
                "max_staleness": 1,
                "correction": {"mode": "mask", "level": "token", "lower": 0.5, "upper": 2.0, "offpolicy_kl": 0.5}}}}},
        "data": {"class_path": "lit_rlhf.data.UltraFeedbackPromptDataModule", "init_args": {
            "path": "bundled:keyfact_chat", "train_split": "train_sft", "val_split": "validation_sft",
            "max_prompt_length": 512, "batch_size": 2, "limit": 8}},
    }
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])
    (metrics,) = list(tmp_path.rglob("metrics.csv"))
    rows = [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(metrics.open())]
    steps = [r for r in rows if "train/rollout_correction/kl_k3" in r]
    assert len(steps) == 3  # 12 episodes of 2 prompts x 2
    assert [round(r["train/entropy/coef"], 6) for r in steps] == [0.001, 0.002, 0.003]  # the YAML's objects parsed
    for r in steps:
        assert r["train/rollout_correction/kl_k3"] >= 0.0 and 0.0 <= r["train/rollout_correction/masked_fraction"] <= 1
        assert r["train/rollout_correction/ratio_min"] <= r["train/rollout_correction/ratio_p50"] <= \
            r["train/rollout_correction/ratio_max"]
    # the first batch is sampled by the learner's weights (other kernels: KV cache); later ones are a step stale
    assert abs(steps[0]["train/rollout_correction/kl_k1"]) < 1e-4
    assert any(abs(r["train/rollout_correction/kl_k1"]) > 1e-4 for r in steps[1:])
