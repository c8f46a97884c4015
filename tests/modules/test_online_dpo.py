"""OnlineDPOModule: pairs annotated by a reward source or a pairwise judge, ties left out, the DPO
loss on log-probs at temperature 1 whatever the sampling temperature."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from lit_rlhf.modules import OnlineDPOModule
from lit_rlhf.rewards import PairwiseJudgeReward
from tests.learning.tasks import make_prompts, prompt_loader
from tests.modules.test_rejection_sampling import Ended
from tests.rewards.test_judge_reward import Hostile, LongerWins

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def fit(reward_fn, steps=1):
    L.seed_everything(0)
    module = OnlineDPOModule(model="tiny-random-llama", reward_fns=[reward_fn], max_new_tokens=6, temperature=0.7,
                             lr=1e-2, lr_scheduler="constant", weight_decay=0.0, log_completions_every_n_steps=0)
    ended = Ended()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[ended],
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    initial = {k: v.clone() for k, v in module.policy.state_dict().items()}
    trainer.fit(module, prompt_loader(module.tokenizer, make_prompts(4, 0), 4))
    return module, ended.rollouts, initial


def test_a_judge_annotates_the_pairs_and_log_probs_are_at_temperature_1():
    judge = LongerWins()
    module, rollouts, initial = fit(PairwiseJudgeReward(judge))
    rollout, metrics = rollouts[0]
    assert judge.seen == [4]  # one judge call per rollout: the 4 prompts' pairs
    assert sorted(rollout.scores.view(-1, 2).sum(dim=1).tolist()) == [1.0] * 4  # winner 1 + loser 0, or 1/2 + 1/2
    ties = float((rollout.scores.view(-1, 2)[:, 0] == 0.5).float().mean())
    assert metrics["train/pairs/tie_fraction"] == pytest.approx(ties) and ties < 1
    # the policy starts as the reference: every implicit reward is 0, the DPO loss log 2
    assert metrics["train/loss/dpo"] == pytest.approx(math.log(2), abs=1e-5)
    # the reference log-probs are at temperature 1, not the sampling temperature 0.7
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_attention_mask)
    with torch.no_grad():
        at_1 = module.response_token_logps(module.ref_model, *args, 1.0)
        at_07 = module.response_token_logps(module.ref_model, *args, 0.7)
    assert torch.allclose(rollout.ref_logps, at_1, atol=1e-6) and not torch.allclose(rollout.ref_logps, at_07, atol=1e-3)
    assert any(not torch.equal(v, initial[k]) for k, v in module.policy.state_dict().items())


def test_a_failing_judge_is_a_tie_and_changes_nothing():
    reward = PairwiseJudgeReward(Hostile("raise"))
    module, rollouts, initial = fit(reward)
    assert reward.failed_calls == 1
    assert rollouts[0][1]["train/pairs/tie_fraction"] == 1.0
    assert all(torch.equal(v, initial[k]) for k, v in module.policy.state_dict().items())  # no annotated pair
