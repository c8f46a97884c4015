import math

import pytest
import torch

from lit_rlhf.losses import grpo_policy_loss, truncated_importance_weights


def test_weights_hand_computed():
    train = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -7.0]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -3.0, -9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    w = truncated_importance_weights(train, sampler, mask, cap=2.0)
    # exp(0.5)=1.6487; exp(-1)=0.3679; exp(0)=1; exp(-2.9)=0.0550; exp(2.9) capped at 2; masked -> 1
    expected = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [math.exp(-2.9), 2.0, 1.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    assert not w.requires_grad


def test_weights_bad_input():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(x, x, x.bool(), cap=0.0)
    with pytest.raises(ValueError, match="same shape"):
        truncated_importance_weights(x, torch.zeros(2, 4), x.bool(), cap=2.0)


def test_grpo_loss_token_weights_scale_each_token():
    # on-policy (ratio 1): per-token loss is -A * w; token_mean over 3 kept tokens
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[True, True], [True, False]])
    w = torch.tensor([[0.5, 2.0], [1.5, 9.0]])
    out = grpo_policy_loss(logps, None, None, adv, mask, token_weights=w)
    expected = (-(1.0 * 0.5) - (1.0 * 2.0) + (2.0 * 1.5)) / 3
    assert out.loss.item() == pytest.approx(expected)
    out.loss.backward()
    # d/dlogp of -A * w * ratio at ratio 1 = -A * w / 3
    assert torch.allclose(logps.grad, torch.tensor([[-0.5 / 3, -2.0 / 3], [3.0 / 3, 0.0]]))
    unweighted = grpo_policy_loss(logps.detach(), None, None, adv, mask)
    assert unweighted.loss.item() == pytest.approx((-1.0 - 1.0 + 2.0) / 3)
