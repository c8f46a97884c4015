import math

import pytest
import torch

from lit_rlhf.losses import grpo_advantages, grpo_policy_loss

LN = math.log


def _close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=0)

# three groups of G = 3: [1, 2, 3], [5, 5, 5], [0, 0, 6]
REWARDS = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0, 0.0, 0.0, 6.0])
CENTRED = [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0, -2.0, -2.0, 4.0]  # minus the group means 2, 5, 2


def test_grpo_advantages_group_scale():
    # unbiased group stds: [1,2,3] -> sqrt((1+0+1)/2) = 1; [0,0,6] -> sqrt((4+4+16)/2) = sqrt(12)
    eps = 1e-4
    adv = grpo_advantages(REWARDS, 3, scale="group", eps=eps)
    s12 = math.sqrt(12.0)
    expected = [-1 / (1 + eps), 0.0, 1 / (1 + eps), 0.0, 0.0, 0.0, -2 / (s12 + eps), -2 / (s12 + eps), 4 / (s12 + eps)]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_grpo_advantages_batch_scale():
    # batch mean 27/9 = 3; squared deviations 4+1+0+4+4+4+9+9+9 = 44; unbiased var 44/8 = 5.5
    adv = grpo_advantages(REWARDS, 3, scale="batch", eps=1e-4)
    assert adv.tolist() == pytest.approx([c / (math.sqrt(5.5) + 1e-4) for c in CENTRED], abs=1e-6)


def test_grpo_advantages_no_scale():
    assert grpo_advantages(REWARDS, 3, scale="none").tolist() == pytest.approx(CENTRED)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_all_equal_group_is_exactly_zero(scale):
    # 0.1 + 0.1 + 0.1 = 0.30000001 in float32, so a naive "r - mean" leaves a rounding residue; with
    # eps = 0 a naive "/ std" would give NaN. The all-equal groups must come out exactly 0.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7])
    adv = grpo_advantages(rewards, 3, scale=scale, eps=0.0)
    assert torch.isfinite(adv).all()
    assert (adv == 0).all()
    mixed = grpo_advantages(torch.tensor([0.1, 0.1, 0.1, 1.0, 2.0, 3.0]), 3, scale=scale, eps=0.0)
    assert (mixed[:3] == 0).all() and torch.isfinite(mixed).all()


def test_grpo_advantages_bad_input():
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(5), 3)
    with pytest.raises(ValueError):
        grpo_advantages(REWARDS, 3, scale="std")


# aggregation example: ratio 1 (logps == old), kl_coef 0, advantages [1, -2], row 1 has one token
#   per-token loss -A: row 0 [-1, -1, -1], row 1 [2, (pad), (pad)]
AGG_MASK = torch.tensor([[True, True, True], [True, False, False]])
AGG_ADV = torch.tensor([1.0, -2.0])


@pytest.mark.parametrize(
    "aggregation, max_len, expected_loss, expected_grad",
    [
        # (-3 + 2) / 4 tokens; grad -A / 4
        ("token_mean", None, -0.25, [[-0.25] * 3, [0.5, 0.0, 0.0]]),
        # mean(-1, 2) = 0.5; grad -A / (len * N): row 0 -1/6, row 1 2/2
        ("sequence_mean", None, 0.5, [[-1 / 6] * 3, [1.0, 0.0, 0.0]]),
        # -1 / (2 * 4); grad -A / 8
        ("constant_normalizer", 4, -0.125, [[-0.125] * 3, [0.25, 0.0, 0.0]]),
        # default normaliser length is T = 3: -1 / 6
        ("constant_normalizer", None, -1 / 6, [[-1 / 6] * 3, [1 / 3, 0.0, 0.0]]),
    ],
)
def test_grpo_aggregations_by_hand(aggregation, max_len, expected_loss, expected_grad):
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -7.0, -7.0]], requires_grad=True)
    out = grpo_policy_loss(
        logps, logps.detach(), None, AGG_ADV, AGG_MASK, aggregation=aggregation, max_completion_length=max_len
    )
    assert out.loss.item() == pytest.approx(expected_loss, abs=1e-6)
    out.loss.backward()
    _close(logps.grad, expected_grad)


def test_grpo_clipping_asymmetric():
    # eps_low = 0.2, eps_high = 0.28, one token per sequence:
    #   ratio 1.5, A = +1: -min(1.5, 1.28) = -1.28, clipped high (grad 0)
    #   ratio 1.5, A = -1: -min(-1.5, -1.28) = 1.5, not clipped (grad -A ratio = 1.5)
    #   ratio 0.5, A = -1: -min(-0.5, -0.8) = 0.8, clipped low (grad 0)
    #   ratio 0.5, A = +1: -min(0.5, 0.8) = -0.5, not clipped (grad -0.5)
    # token mean = (-1.28 + 1.5 + 0.8 - 0.5) / 4 = 0.13
    logps = torch.tensor([[LN(1.5)], [LN(1.5)], [LN(0.5)], [LN(0.5)]], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    mask = torch.ones(4, 1, dtype=torch.bool)
    out = grpo_policy_loss(logps, torch.zeros(4, 1), None, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    assert out.loss.item() == pytest.approx(0.13, abs=1e-6)
    assert out.clipfrac_low.item() == pytest.approx(0.25)
    assert out.clipfrac_high.item() == pytest.approx(0.25)
    assert out.clipfrac.item() == pytest.approx(0.5)
    assert out.ratio_mean.item() == pytest.approx(1.0)
    out.loss.backward()
    assert logps.grad.flatten().tolist() == pytest.approx([0.0, 1.5 / 4, 0.0, -0.5 / 4], abs=1e-6)


def test_grpo_k3_kl_in_loss():
    # A = 0 so only the KL term remains; logps - ref = [ln 2, 0]:
    # k3(ln 2) = e^{-ln 2} - 1 + ln 2 = 0.5 - 1 + 0.6931472 = 0.1931472, k3(0) = 0
    # loss = kl_coef * mean = 0.1 * 0.1931472 / 2; d k3 / d logp = 1 - e^{-lr} = 0.5 -> grad 0.1 * 0.5 / 2
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.0 - LN(2.0), -2.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = grpo_policy_loss(logps, logps.detach(), ref, torch.zeros(1), mask, kl_coef=0.1)
    k3 = 0.5 - 1 + LN(2.0)
    assert out.kl.item() == pytest.approx(k3 / 2, abs=1e-6)
    assert out.loss.item() == pytest.approx(0.1 * k3 / 2, abs=1e-6)
    assert out.policy_loss.item() == 0.0
    out.loss.backward()
    _close(logps.grad, [[0.025, 0.0]])


def test_grpo_beta_zero_without_reference():
    gen = torch.Generator().manual_seed(0)
    logps = torch.randn(4, 5, generator=gen)
    old = logps + 0.3 * torch.randn(4, 5, generator=gen)
    adv = torch.randn(4, generator=gen)
    mask = torch.rand(4, 5, generator=gen) > 0.3
    out = grpo_policy_loss(logps, old, None, adv, mask)
    with_ref = grpo_policy_loss(logps, old, logps - 1.0, adv, mask)
    assert torch.allclose(out.loss, with_ref.loss)
    assert out.kl.item() == 0.0
    assert with_ref.kl.item() > 0.0  # logged even when it is not in the loss
    with pytest.raises(ValueError, match="ref_logps"):
        grpo_policy_loss(logps, old, None, adv, mask, kl_coef=0.04)
    # old_logps=None is the single on-policy step: ratio 1, loss = -token mean of A
    single = grpo_policy_loss(logps, None, None, adv, mask)
    expected = -(adv[:, None].expand(4, 5)[mask]).mean()
    assert single.loss.item() == pytest.approx(expected.item(), abs=1e-6)


def test_grpo_padding_garbage_gives_finite_gradients():
    # padding with log-ratios of +-1000 would overflow exp (and k3); it must not leak NaN into the gradient
    logps = torch.tensor([[-1.0, 0.0], [-2.0, -1000.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1000.0], [-2.0, 0.0]])
    ref = torch.tensor([[-1.0, 1000.0], [-2.0, -1000.0]])
    mask = torch.tensor([[True, False], [True, False]])
    out = grpo_policy_loss(logps, old, ref, torch.tensor([1.0, -1.0]), mask, kl_coef=0.1)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logps.grad).all()
    # kept tokens: ratio 1, k3 = 0 -> loss = mean(-1, +1) = 0; grads -A / 2 (k3'(0) = 0)
    assert out.loss.item() == 0.0
    _close(logps.grad, [[-0.5, 0.0], [0.5, 0.0]])
