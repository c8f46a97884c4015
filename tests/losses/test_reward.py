import math

import pytest
import torch

from lit_rlhf.losses import bradley_terry_loss


def _nls(x: float) -> float:
    """-log sigmoid(x) = log(1 + exp(-x))."""
    return math.log1p(math.exp(-x))


def test_bradley_terry_by_hand():
    # diffs r_c - r_r = [2, 0]; loss = (log(1 + e^-2) + log 2) / 2 = (0.126928 + 0.693147) / 2
    out = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]))
    assert out.loss.item() == pytest.approx((_nls(2.0) + math.log(2.0)) / 2, abs=1e-6)
    assert out.loss.item() == pytest.approx(0.4100375, abs=1e-6)
    assert out.accuracy.item() == 0.5  # the tie (diff 0) counts as wrong
    assert out.chosen_mean.item() == 1.0
    assert out.rejected_mean.item() == 0.0
    assert out.margin_mean.item() == 1.0
    assert out.ranking_loss.item() == pytest.approx(out.loss.item())


def test_bradley_terry_margin_llama2():
    # diffs [2, 0], margins [2, -ln 3] -> logits [0, ln 3]
    # -log sigmoid(0) = ln 2; -log sigmoid(ln 3) = ln(1 + 1/3) = ln(4/3); mean = ln(8/3) / 2
    margin = torch.tensor([2.0, -math.log(3.0)])
    out = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]), margin=margin)
    assert out.loss.item() == pytest.approx(math.log(8.0 / 3.0) / 2, abs=1e-6)
    # statistics describe the rewards, not the margin-shifted logits
    assert out.margin_mean.item() == 1.0
    assert out.accuracy.item() == 0.5


def test_bradley_terry_centring_term():
    # r_c = [1, -1], r_r = [0, -1]: diffs [1, 0]; sums [1, -2] -> mean of squares (1 + 4) / 2 = 2.5
    # loss = (log(1 + e^-1) + ln 2) / 2 + 0.1 * 2.5
    chosen, rejected = torch.tensor([1.0, -1.0]), torch.tensor([0.0, -1.0])
    out = bradley_terry_loss(chosen, rejected, center_coef=0.1)
    ranking = (_nls(1.0) + math.log(2.0)) / 2
    assert out.loss.item() == pytest.approx(ranking + 0.25, abs=1e-6)
    assert out.ranking_loss.item() == pytest.approx(ranking, abs=1e-6)
    assert out.center_loss.item() == pytest.approx(2.5)
    # without the coefficient the centring term is only logged
    assert bradley_terry_loss(chosen, rejected).loss.item() == pytest.approx(ranking, abs=1e-6)


def test_bradley_terry_gradient_by_hand():
    # B = 1, r_c = 1, r_r = 0, center 0.1:
    # d/dr_c = -sigmoid(-(r_c - r_r)) + 0.1 * 2 * (r_c + r_r) = -0.2689414 + 0.2
    # d/dr_r = +sigmoid(-1) + 0.2 = 0.2689414 + 0.2
    chosen = torch.tensor([1.0], requires_grad=True)
    rejected = torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(chosen, rejected, center_coef=0.1).loss.backward()
    s = 1.0 / (1.0 + math.e)  # sigmoid(-1)
    assert chosen.grad.item() == pytest.approx(-s + 0.2, abs=1e-6)
    assert rejected.grad.item() == pytest.approx(s + 0.2, abs=1e-6)


def test_bradley_terry_shift_invariant_without_centring():
    chosen, rejected = torch.tensor([0.3, -1.2, 2.0]), torch.tensor([0.1, 0.4, -0.5])
    base = bradley_terry_loss(chosen, rejected).loss
    shifted = bradley_terry_loss(chosen + 7.0, rejected + 7.0)
    assert torch.allclose(shifted.loss, base, atol=1e-6)
    # the centring term is what breaks the invariance
    assert bradley_terry_loss(chosen + 7.0, rejected + 7.0, center_coef=0.01).loss > base + 1.0


def test_bradley_terry_stats_are_detached():
    chosen = torch.tensor([1.0, 2.0], requires_grad=True)
    out = bradley_terry_loss(chosen, torch.zeros(2))
    assert out.loss.requires_grad
    assert not any(t.requires_grad for t in out[1:])
