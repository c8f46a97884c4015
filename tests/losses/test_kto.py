import math

import pytest
import torch

from lit_rlhf.losses import kto_kl_estimate, kto_loss, labels_from_rewards


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_kto_by_hand_with_weights():
    # log-ratios r = [(-1) - (-2), (-3) - (-2)] = [1, -1]; example 0 desirable, 1 undesirable;
    # beta = 0.5, z0 = 1, lambda_D = 2, lambda_U = 3:
    #   desirable:   2 * (1 - sigmoid(0.5 * (1 - 1)))  = 2 * 0.5            = 1
    #   undesirable: 3 * (1 - sigmoid(0.5 * (1 - -1))) = 3 * (1 - sig(1))   = 0.8068243
    # loss = mean over the batch = 0.9034121
    out = kto_loss(
        torch.tensor([-1.0, -3.0]),
        torch.tensor([-2.0, -2.0]),
        desirable=torch.tensor([True, False]),
        kl=torch.tensor(1.0),
        beta=0.5,
        desirable_weight=2.0,
        undesirable_weight=3.0,
    )
    assert out.losses.tolist() == pytest.approx([1.0, 3 * (1 - _sigmoid(1.0))], abs=1e-6)
    assert out.loss.item() == pytest.approx((1.0 + 3 * (1 - _sigmoid(1.0))) / 2, abs=1e-6)
    assert out.rewards.tolist() == pytest.approx([0.5, -0.5])
    assert out.desirable_rewards.item() == pytest.approx(0.5)
    assert out.undesirable_rewards.item() == pytest.approx(-0.5)
    assert (out.num_desirable.item(), out.num_undesirable.item()) == (1, 1)
    assert out.kl.item() == 1.0


def test_kto_mean_is_over_the_whole_batch():
    # three desirable examples at r = z0 (loss 0.5 each) and one undesirable at r = z0 (loss 0.5 * 4):
    # the batch mean is (3 * 0.5 + 2) / 4 = 0.875, not the mean of class means (0.5 + 2) / 2 = 1.25
    out = kto_loss(
        torch.zeros(4), torch.zeros(4), torch.tensor([True, True, True, False]), kl=0.0, beta=1.0,
        undesirable_weight=4.0,
    )
    assert out.loss.item() == pytest.approx(0.875)


def test_kto_clamps_negative_kl_to_zero():
    # kl = -5 -> z0 = 0; r = [1, -1], beta = 0.5:
    #   desirable 1 - sig(0.5 * 1) = 0.3775407; undesirable 1 - sig(0.5 * (0 - -1)) = 0.3775407
    out = kto_loss(torch.tensor([1.0, -1.0]), torch.zeros(2), torch.tensor([True, False]), kl=-5.0, beta=0.5)
    assert out.kl.item() == 0.0
    assert out.losses.tolist() == pytest.approx([1 - _sigmoid(0.5)] * 2, abs=1e-6)


def test_kto_does_not_backprop_into_z0():
    kl = torch.tensor(0.3, requires_grad=True)
    policy = torch.tensor([-1.0, -2.0], requires_grad=True)
    out = kto_loss(policy, torch.tensor([-1.3, -1.7]), torch.tensor([True, False]), kl=kl, beta=2.0)
    out.loss.backward()
    assert kl.grad is None
    assert not out.kl.requires_grad
    # and the policy gradient is the hand-derived one: r = [0.3, -0.3], z0 = 0.3
    # desirable: d/dr (1 - sig(beta (r - z0))) = -beta sig(0) (1 - sig(0)) = -0.5 -> /B = -0.25
    # undesirable: d/dr (1 - sig(beta (z0 - r))) = +beta s (1 - s), s = sig(2 * 0.6) -> /B
    s = _sigmoid(1.2)
    assert policy.grad.tolist() == pytest.approx([-0.25, 2.0 * s * (1 - s) / 2], abs=1e-6)


def test_kto_single_class_batch_has_finite_stats():
    out = kto_loss(torch.tensor([0.5, 1.5]), torch.zeros(2), torch.tensor([True, True]), kl=0.0, beta=1.0)
    assert out.num_undesirable.item() == 0
    assert out.undesirable_rewards.item() == 0.0
    assert out.desirable_rewards.item() == pytest.approx(1.0)
    assert torch.isfinite(out.loss)


def test_kto_kl_estimate():
    # mean log-ratio of [(-1) - (-2), (-2) - (-2)] = mean [1, 0] = 0.5
    policy = torch.tensor([-1.0, -2.0], requires_grad=True)
    kl = kto_kl_estimate(policy, torch.tensor([-2.0, -2.0]))
    assert kl.item() == pytest.approx(0.5)
    assert not kl.requires_grad
    # a negative mean log-ratio is clamped at 0; clamp=False gives it as it is (logged as objective/kl_raw)
    assert kto_kl_estimate(torch.tensor([-3.0, -2.0]), torch.tensor([-2.0, -2.0])).item() == 0.0
    raw = kto_kl_estimate(torch.tensor([-3.0, -2.0], requires_grad=True), torch.tensor([-2.0, -2.0]), clamp=False)
    assert raw.item() == pytest.approx(-0.5) and not raw.requires_grad


def test_labels_from_rewards_leave_ties_unlabelled():
    # mean of [1, 2, 3, 6] is 3: 6 is above it (desirable), 1 and 2 below (undesirable), 3 ties (no label)
    labels = labels_from_rewards(torch.tensor([1.0, 2.0, 3.0, 6.0]))
    assert labels.desirable.dtype == torch.bool and labels.tied.dtype == torch.bool
    assert labels.desirable.tolist() == [False, False, False, True]
    assert labels.tied.tolist() == [False, False, True, False]
    assert labels.labelled.tolist() == [True, True, False, True]
    assert labels_from_rewards(torch.tensor([-0.5, 0.5])).desirable.tolist() == [False, True]
    assert not labels_from_rewards(torch.tensor([-0.5, 0.5])).tied.any()
    # an all-equal batch is all tied, whatever the value: the float32 mean of seven 0.3s is below
    # 0.3, so a plain `rewards > rewards.mean()` would call all seven desirable
    sevens = torch.full((7,), 0.3)
    assert (sevens > sevens.mean()).all()  # the rounding the exact comparison avoids
    for rewards in (torch.full((3,), 2.0), sevens, torch.full((64,), 0.1), torch.zeros(5)):
        labels = labels_from_rewards(rewards)
        assert labels.tied.all() and not labels.desirable.any(), rewards
    # a 0/1 reward: the mean 1/4 is never hit, so nothing ties
    labels = labels_from_rewards(torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert labels.desirable.tolist() == [False, True, False, False] and not labels.tied.any()


def test_kto_leaves_unlabelled_rows_out_of_the_loss_by_hand():
    # r = [1, -1, 0]; row 2 unlabelled (tied); beta = 1, z0 = 0:
    #   desirable row 0:   1 - sigmoid(1)  = 0.2689414
    #   undesirable row 1: 1 - sigmoid(1)  = 0.2689414
    #   row 2 (any label): left out, loss 0
    # loss = (0.2689414 + 0.2689414) / 2 labelled rows = 0.2689414 (not / 3)
    policy = torch.tensor([1.0, -1.0, 0.0], requires_grad=True)
    out = kto_loss(policy, torch.zeros(3), torch.tensor([True, False, True]), kl=0.0, beta=1.0,
                   labelled=torch.tensor([True, True, False]))
    assert out.loss.item() == pytest.approx(1 - _sigmoid(1.0), abs=1e-6)
    assert out.losses.tolist() == pytest.approx([1 - _sigmoid(1.0), 1 - _sigmoid(1.0), 0.0], abs=1e-6)
    assert (out.num_desirable.item(), out.num_undesirable.item(), out.num_unlabelled.item()) == (1, 1, 1)
    assert out.desirable_rewards.item() == pytest.approx(1.0)  # the unlabelled row is in no class mean
    out.loss.backward()
    assert policy.grad[2].item() == 0.0 and policy.grad[0].item() < 0 < policy.grad[1].item()
    # every row labelled: the plain mean over the batch, as without `labelled`
    full = kto_loss(torch.tensor([1.0, -1.0]), torch.zeros(2), torch.tensor([True, False]), kl=0.0, beta=1.0)
    assert full.num_unlabelled.item() == 0 and full.loss.item() == pytest.approx(1 - _sigmoid(1.0), abs=1e-6)


def test_kto_all_tied_batch_gives_zero_loss_and_exactly_zero_gradient():
    policy = torch.tensor([0.5, -0.5, 2.0], requires_grad=True)
    labels = labels_from_rewards(torch.full((3,), 0.3))
    out = kto_loss(policy, torch.zeros(3), labels.desirable, kl=0.0, beta=5.0, labelled=labels.labelled)
    assert out.loss.item() == 0.0 and torch.isfinite(out.loss)
    assert (out.num_desirable.item(), out.num_undesirable.item(), out.num_unlabelled.item()) == (0, 0, 3)
    assert out.desirable_rewards.item() == 0.0 and out.undesirable_rewards.item() == 0.0
    out.loss.backward()  # still attached to the graph
    assert policy.grad.tolist() == [0.0, 0.0, 0.0]


def test_weight_ratio_by_hand():
    from lit_rlhf.losses import KTO_WEIGHT_RATIO_RANGE, kto_weight_ratio

    assert kto_weight_ratio(3, 4, 1.0, 1.0) == 0.75
    assert kto_weight_ratio(3, 4, 1.33, 1.0) == pytest.approx(0.9975)
    assert kto_weight_ratio(torch.tensor(6), torch.tensor(2), 0.5, 1.5) == 1.0
    assert kto_weight_ratio(2, 0, 1.0, 1.0) == float("inf")
    assert KTO_WEIGHT_RATIO_RANGE == (1.0, 4.0 / 3.0)
