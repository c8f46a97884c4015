"""The GRPO family on the tiny model: DAPO's dynamic sampling and overlong filtering, GSPO,
REINFORCE++ (with and without its baseline), and reward-function errors stopping the step."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning import Callback

from lit_rlhf.modules import DAPOModule, GRPOModule, GSPOModule, ReinforcePPModule
from lit_rlhf.online import HFSampler
from lit_rlhf.rewards import CharacterFractionReward, RewardFunctionError
from tests.modules.test_grpo import LETTERS, fit

FLAT = {"hello there", "what is", "x", "abc"}  # prompts whose completions all score the same


def half_flat_reward(prompts, completions, **columns):
    """Constant on the FLAT prompts (zero-variance groups), the letter fraction elsewhere."""
    letters = CharacterFractionReward(LETTERS)(prompts, completions)
    return [0.5 if p in FLAT else r for p, r in zip(prompts, letters)]


class Last(Callback):
    def __init__(self, shape=None):
        self.shape = shape
        self.rollouts = []

    def on_rollout_scores(self, trainer, pl_module, rollout):
        return self.shape(rollout) if self.shape else rollout

    def on_rollout_end(self, trainer, pl_module, rollout):
        self.rollouts.append(rollout)


class StatSampler(HFSampler):
    """The in-process sampler reporting a stat of its own, as a vLLM or asynchronous source does."""

    def sample(self, model, batch, repeats, sampling, training=True):
        rollout, stats = super().sample(model, batch, repeats, sampling, training)
        return rollout, {**stats, "time/source_stat": torch.tensor(float(batch.input_ids.shape[0]))}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_dynamic_sampling_keeps_informative_groups_and_counts_the_extra_generation(tmp_path):
    L.seed_everything(0)
    # GRPO's clip and every completion in the loss: dynamic sampling alone
    module = DAPOModule(model="tiny-random-llama", reward_fns=[half_flat_reward], num_generations=2,
                        max_new_tokens=4, kl_coef=0.0, dynamic_sampling=True, max_sampling_rounds=3, total_episodes=32,
                        clip_eps_high=0.2, mask_truncated=False, rollout=StatSampler())
    seen = Last()
    trainer, metrics = fit(module, tmp_path, [seen])
    assert len(metrics) >= 2 and len(seen.rollouts) == len(metrics)
    for m, rollout in zip(metrics, seen.rollouts):
        assert m["train/time/source_stat"] == 4  # the source's stats of the step's own 4 prompts, kept
        rounds, found, filled = (m[f"train/dynamic_sampling/{k}"] for k in ("rounds", "informative_groups",
                                                                          "filled_groups"))
        assert 1 <= rounds <= 3 and m["train/dynamic_sampling/rollouts_per_step"] == rounds
        assert filled == max(0.0, 4 - found)
        # the batch keeps its 4 groups of 2; the informative groups come first
        assert rollout.scores.shape == (8,)
        grouped = rollout.scores.view(4, 2)
        informative = (grouped[:, 0] != grouped[:, 1]).tolist()
        assert informative == [True] * int(4 - filled) + [False] * int(filled)
        assert not any(p in FLAT for p in rollout.meta["prompt"][: 2 * int(4 - filled)])
    generated = sum(m["train/dynamic_sampling/rollouts_per_step"] for m in metrics) * 8
    assert module.episodes == generated  # every generated response is an episode
    assert module.refill_batches == sum(m["train/dynamic_sampling/rounds"] - 1 for m in metrics)
    # the refill stream is a pure function of (seed, index): the same prompts again, and the
    # counter travels in checkpoints
    first, again, other = (module.refill_batch(4, k).meta["prompt"] for k in (0, 0, 1))
    assert first == again and first != other
    ckpt = {"lit_rlhf": {}}
    module.on_save_checkpoint(ckpt)
    fresh = DAPOModule(model="tiny-random-llama", reward_fns=[half_flat_reward], kl_coef=0.0, dynamic_sampling=True)
    fresh.on_load_checkpoint(ckpt)
    assert fresh.refill_batches == module.refill_batches


def test_overlong_filtering_masks_truncated_completions_out_of_the_loss(tmp_path):
    def all_truncated(rollout):
        return rollout._replace(has_eos=torch.zeros_like(rollout.has_eos))

    moved = {}
    for mask_truncated in (True, False):
        L.seed_everything(0)
        module = DAPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)],
                            num_generations=2, max_new_tokens=4, kl_coef=0.0, lr=1e-2, total_episodes=8,
                            mask_truncated=mask_truncated, dynamic_sampling=False, clip_eps_high=0.2)
        before = [p.detach().clone() for p in module.policy.parameters()]
        _, (m,) = fit(module, tmp_path / str(mask_truncated), [Last(all_truncated)])
        moved[mask_truncated] = any(not torch.equal(a, b) for a, b in zip(before, module.policy.parameters()))
        if mask_truncated:
            assert m["train/policy/loss"] == 0.0 and m["train/policy/ratio_mean"] == 0.0  # no token kept
    assert moved == {True: False, False: True}


@pytest.mark.parametrize(("cls", "options"), [
    (GSPOModule, {"num_iterations": 2}),  # the paper's clip ranges 3e-4 / 4e-4 are GSPOModule's defaults
    (ReinforcePPModule, {"kl_coef": 0.05}),
    (ReinforcePPModule, {"baseline": True, "kl_coef": 0.0, "reward_normalization": "group"}),
], ids=["gspo", "reinforce_pp", "reinforce_pp_baseline"])
def test_gspo_and_reinforce_pp_train(tmp_path, cls, options):
    L.seed_everything(0)
    kwargs = {"kl_coef": 0.0, **options}
    module = cls(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], num_generations=2,
                 max_new_tokens=4, lr=1e-3, total_episodes=16, **kwargs)
    before = [p.detach().clone() for p in module.policy.parameters()]
    _, metrics = fit(module, tmp_path)
    assert len(metrics) == 2
    for m in metrics:
        assert all(math.isfinite(v) for v in m.values())
        assert m["train/policy/first_ratio_mean"] == pytest.approx(1.0)  # the first pass is on-policy
    assert any(not torch.equal(a, b) for a, b in zip(before, module.policy.parameters()))
    if cls is ReinforcePPModule and module.kl_coef > 0:
        assert module.needs_rollout_logps  # the KL in the reward needs the sampling-time log-probs


def test_reward_function_columns_and_errors_stop_the_step(tmp_path):
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(columns)
        return [0.0] * len(completions)

    def broken(prompts, completions, **columns):
        raise ZeroDivisionError("no")

    L.seed_everything(0)
    module = GRPOModule(model="tiny-random-llama", reward_fns=[spy, broken], num_generations=2, max_new_tokens=3,
                        kl_coef=0.0, total_episodes=16)
    before = [p.detach().clone() for p in module.policy.parameters()]
    with pytest.raises(RewardFunctionError, match=r"'broken' raised ZeroDivisionError: no on row 0 of the rollout"):
        fit(module, tmp_path)
    assert set(seen) >= {"completion_length", "truncated", "prompt"}
    assert all(0 < n <= 3 for n in seen["completion_length"])
    assert all(torch.equal(a, b) for a, b in zip(before, module.policy.parameters()))  # no step on garbage


def test_bad_family_options_are_named():
    with pytest.raises(ValueError, match="max_sampling_rounds"):
        DAPOModule(model="tiny-random-llama", reward_fns=[half_flat_reward], max_sampling_rounds=0)
    with pytest.raises(ValueError, match="reward_normalization"):
        GRPOModule(model="tiny-random-llama", reward_fns=[half_flat_reward], reward_normalization="zscore")
