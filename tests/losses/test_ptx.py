"""PPO-ptx's language-modelling term and the token-mean NLL it is built on, against values worked
out by hand (`lit_rlhf.losses.ptx`, `lit_rlhf.losses.nll`)."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.losses import nll_loss, ptx_loss

# two rows: row 0 scores tokens 0 and 1 (log-probs -1, -3), row 1 scores token 0 (-2): 3 tokens
LOGPS = [[-1.0, -3.0, -9.0], [-2.0, -9.0, -9.0]]
MASK = torch.tensor([[True, True, False], [True, False, False]])


def test_nll_loss_divides_by_the_given_token_count():
    logps = torch.tensor(LOGPS, requires_grad=True)
    assert nll_loss(logps, MASK).item() == pytest.approx(2.0)  # (1 + 3 + 2) / 3
    assert nll_loss(logps, MASK, num_tokens=4).item() == pytest.approx(1.5)  # 6 / 4
    assert nll_loss(logps, MASK, num_tokens=torch.tensor(6)).item() == pytest.approx(1.0)
    # a micro-batch's share with the whole batch's count: the shares add up to the batch's token mean
    shares = [nll_loss(logps[i: i + 1], MASK[i: i + 1], num_tokens=MASK.sum()) for i in range(2)]
    assert [s.item() for s in shares] == pytest.approx([4 / 3, 2 / 3])
    with pytest.raises(ValueError, match="num_tokens"):
        nll_loss(logps, MASK, num_tokens=0)


def test_ptx_loss_is_gamma_times_the_token_mean_nll():
    """Eq. 2's term as a loss: gamma * (1 + 3 + 2) / 3 = 2 gamma; d loss / d logp = -gamma / 3 on
    each scored token, 0 elsewhere (so a gradient descent step raises the log-likelihood)."""
    logps = torch.tensor(LOGPS, requires_grad=True)
    out = ptx_loss(logps, MASK, ptx_coef=0.5)
    assert out.loss.item() == pytest.approx(1.0) and out.nll.item() == pytest.approx(2.0)
    assert not out.nll.requires_grad
    out.loss.backward()
    assert torch.allclose(logps.grad, torch.tensor([[-0.5 / 3, -0.5 / 3, 0.0], [-0.5 / 3, 0.0, 0.0]]))
    stepped = logps.detach() - 0.1 * logps.grad  # one SGD step on the loss
    assert bool((stepped[MASK] > logps.detach()[MASK]).all())


def test_ptx_loss_over_micro_batches_equals_the_whole_batch():
    """Each row's share with the batch's token count: the same loss (summed) and gradients."""
    whole = torch.tensor(LOGPS, requires_grad=True)
    ptx_loss(whole, MASK, 2.0).loss.backward()
    split = torch.tensor(LOGPS, requires_grad=True)
    parts = [ptx_loss(split[i: i + 1], MASK[i: i + 1], 2.0, num_tokens=MASK.sum()) for i in range(2)]
    total = parts[0].loss + parts[1].loss
    assert total.item() == pytest.approx(4.0)  # 2 * 2
    assert [p.nll.item() for p in parts] == pytest.approx([4 / 3, 2 / 3])
    total.backward()
    assert torch.equal(split.grad, whole.grad)


def test_ptx_coef_zero_adds_nothing_and_a_negative_one_is_refused():
    logps = torch.tensor(LOGPS, requires_grad=True)
    out = ptx_loss(logps, MASK, 0.0)
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.nll.item() == pytest.approx(2.0) and logps.grad.abs().sum() == 0
    with pytest.raises(ValueError, match="ptx_coef"):
        ptx_loss(logps, MASK, -1.0)
