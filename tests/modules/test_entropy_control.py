"""Clip-Cov and KL-Cov as `GRPOModule(entropy={"covariance": ...})` (`losses.CovarianceControl`): KL-Cov on
a single on-policy pass is plain GRPO bitwise (|log-ratio| is 0 there, and so is its gradient);
Clip-Cov with every token in its band trains nothing; KL-Cov over two passes changes the update;
variants whose loss is not GRPO's refuse it; the entropy bonus (`entropy={"bonus": ...}`) fixed,
adaptive and resumed exactly; the former `entropy_control` and `entropy_bonus` name their new place."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.losses import CovarianceControl, EntropyControl
from lit_rlhf.losses.entropy_bonus import EntropyBonus
from lit_rlhf.modules import DAPOModule, GRPOModule, GSPOModule, ReinforcePPModule
from lit_rlhf.rewards import CharacterFractionReward
from tests.modules.test_grpo import LETTERS, fit

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run(path, control, num_iterations=1):
    L.seed_everything(0)
    module = GRPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], num_generations=2,
                        max_new_tokens=4, lr=1e-3, lr_scheduler="constant", kl_coef=0.0, total_episodes=16,
                        num_iterations=num_iterations, entropy={"covariance": control})
    initial = [p.detach().clone() for p in module.policy.parameters()]
    fit(module, path)
    return initial, list(module.policy.parameters())


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_covariance_controls_in_grpo(tmp_path):
    initial, plain = run(tmp_path / "plain", None)
    assert not same(initial, plain)
    _, kl_cov = run(tmp_path / "kl_cov", CovarianceControl("kl_cov", ratio=1.0, kl_coef=10.0))
    assert same(plain, kl_cov)  # on-policy: the penalty and its gradient are 0
    start, clip_all = run(tmp_path / "clip_cov", {"method": "clip_cov", "ratio": 1.0, "lower": -1e9, "upper": 1e9})
    assert same(start, clip_all)  # every token detached: no gradient, no step (weight decay 0)
    _, clip_none = run(tmp_path / "clip_cov_empty", CovarianceControl("clip_cov", ratio=1.0, lower=1e8, upper=1e9))
    assert same(plain, clip_none)  # an empty band detaches nothing
    _, two_plain = run(tmp_path / "two", None, num_iterations=2)
    _, two_kl_cov = run(tmp_path / "two_kl_cov", CovarianceControl("kl_cov", ratio=1.0, kl_coef=10.0), num_iterations=2)
    assert not same(two_plain, two_kl_cov)  # the second pass is off the old policy: penalised


def test_only_grpo_s_loss_takes_it():
    control = CovarianceControl()
    DAPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)],
               entropy=EntropyControl(covariance=control))
    for cls in (GSPOModule, ReinforcePPModule):
        with pytest.raises(ValueError, match="entropy"):
            cls(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)],
                entropy=EntropyControl(covariance=control))
    for former, new in (("entropy_control", "entropy: {covariance"), ("entropy_bonus", "entropy: {bonus")):
        with pytest.raises(TypeError, match=f"GRPOModule: `{former}` moved: use {new}"):
            GRPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], **{former: {}})
    with pytest.raises(ValueError, match="method"):
        CovarianceControl("clip")
    with pytest.raises(ValueError, match="lower < upper"):
        CovarianceControl(lower=5.0, upper=1.0)


def bonus_run(path, bonus):
    L.seed_everything(0)
    module = GRPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], num_generations=2,
                        max_new_tokens=4, lr=1e-3, lr_scheduler="constant", kl_coef=0.0, total_episodes=16,
                        entropy={"bonus": bonus})
    _, metrics = fit(module, path)
    return module, metrics


def test_entropy_bonus_fixed_and_adaptive(tmp_path):
    _, plain = run(tmp_path / "plain", None)
    zero, metrics = bonus_run(tmp_path / "zero", EntropyBonus(coef=0.0))
    assert same(plain, zero.policy.parameters())  # a coefficient of 0 is plain GRPO, bitwise
    assert all(m["train/entropy/estimate"] > 0 for m in metrics)
    fixed, metrics = bonus_run(tmp_path / "fixed", EntropyBonus(coef=0.5))
    assert not same(plain, fixed.policy.parameters()) and all(m["train/entropy/coef"] == 0.5 for m in metrics)
    # a target far above the entropy: the coefficient rises by `step` each rollout, up to its bound
    adaptive, metrics = bonus_run(tmp_path / "adaptive", {"coef": 0.01, "target": 100.0, "step": 0.01, "max_coef": 0.015})
    assert [round(m["train/entropy/coef"], 6) for m in metrics] == [0.01, 0.015]  # 2 rollouts, then clipped
    assert adaptive.entropy_coef == 0.015


def test_entropy_bonus_coefficient_resumes_exactly(tmp_path):
    from tests.resume.harness import Interrupt, Setup, assert_same_run
    from tests.resume.harness import fit as resume_fit
    from tests.resume.harness import interrupted_then_resumed

    setup = Setup("grpo", module_args={"entropy": EntropyControl(bonus=EntropyBonus(0.01, 100.0, 0.01, 0.0, 1.0))})
    straight = resume_fit(setup, tmp_path / "straight")
    runs, final = interrupted_then_resumed(setup, tmp_path / "run", Interrupt("on_train_batch_end", 2))
    assert_same_run(straight, runs, final, tmp_path / "straight", tmp_path / "run")
    assert final.module.entropy_coef == straight.module.entropy_coef == pytest.approx(0.05)  # 0.01 + 4 steps
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["lit_rlhf"]["entropy_coef"] == pytest.approx(0.05)
