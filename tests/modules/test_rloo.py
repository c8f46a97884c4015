"""RLOOModule: the KL sits in the sequence reward, the update is REINFORCE on summed log-probs."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.losses import rloo_advantages
from lit_rlhf.ops import kl_penalized_sequence_rewards
from lit_rlhf.modules import RLOOModule
from lit_rlhf.rewards import CharacterFractionReward
from tests.modules.test_grpo import fit
from tests.modules.test_token_mean import early_eos


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_update_is_reinforce_with_the_kl_in_the_reward(tmp_path):
    """The first update is RLOO on the rollout: sequence rewards score - kl_coef * KL (the policy
    has moved from the reference after step 1), leave-one-out advantages, summed log-probs."""
    L.seed_everything(0)
    module = RLOOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward("abcdefghijklm")],
                        num_generations=2, kl_coef=0.5, max_new_tokens=10, lr=1e-2, total_episodes=16, max_grad_norm=None)
    early_eos(module)
    seen = {}
    update = module.update

    def recording_update(rollout):
        if "rollout" not in seen and module.rollouts == 1:  # the second rollout: policy != reference
            seen["rollout"] = rollout
            seen["weights"] = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        return update(rollout)

    module.update = recording_update
    trainer, metrics = fit(module, tmp_path)
    assert len(metrics) == 2
    assert metrics[1]["train/objective/kl"] != 0.0
    rollout = seen["rollout"]
    rewards, kl = kl_penalized_sequence_rewards(rollout.scores, rollout.logps, rollout.ref_logps, rollout.loss_mask, 0.5)
    advantages = rloo_advantages(rewards, 2)
    assert torch.count_nonzero(kl) > 0 and torch.count_nonzero(advantages) > 0
    assert metrics[1]["train/rewards/kl_penalised"] == pytest.approx(float(rewards.mean()), abs=1e-5)
    assert metrics[1]["train/advantages/abs_mean"] == pytest.approx(float(advantages.abs().mean()), abs=1e-5)
    moved = [n for n, p in module.policy.named_parameters() if not torch.equal(p.detach(), seen["weights"][n])]
    assert moved


def test_needs_two_generations():
    with pytest.raises(ValueError, match="num_generations"):
        RLOOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward("a")], num_generations=1)
