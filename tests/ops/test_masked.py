import pytest
import torch

from lit_rlhf.ops import masked_mean, masked_sum, masked_var, masked_whiten

VALUES = torch.tensor([[1.0, 2.0, 100.0], [3.0, -50.0, -50.0]])
MASK = torch.tensor([[True, True, False], [True, False, False]])  # kept: 1, 2, 3


def test_masked_sum_and_mean_by_hand():
    assert masked_sum(VALUES, MASK).item() == 6.0
    assert masked_mean(VALUES, MASK).item() == 2.0
    # per row: sums [3, 3], counts [2, 1] -> means [1.5, 3]
    assert masked_sum(VALUES, MASK, dim=1).tolist() == [3.0, 3.0]
    assert masked_mean(VALUES, MASK, dim=1).tolist() == [1.5, 3.0]


def test_masked_mean_of_nothing_is_zero():
    empty = torch.zeros_like(MASK)
    assert masked_mean(VALUES, empty).item() == 0.0
    first_only = torch.tensor([[True, False, False], [False, False, False]])
    assert masked_mean(VALUES, first_only, dim=1).tolist() == [1.0, 0.0]


def test_masked_var_by_hand():
    # kept 1, 2, 3: mean 2, squared deviations 1 + 0 + 1 = 2 -> unbiased 2/2 = 1, biased 2/3
    assert masked_var(VALUES, MASK).item() == pytest.approx(1.0)
    assert masked_var(VALUES, MASK, unbiased=False).item() == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        masked_var(VALUES, torch.tensor([[True, False, False], [False, False, False]]))


def test_masked_whiten_mean_zero_var_one():
    gen = torch.Generator().manual_seed(0)
    values = 3.0 + 2.0 * torch.randn(4, 7, generator=gen)
    mask = torch.rand(4, 7, generator=gen) > 0.3
    white = masked_whiten(values, mask)
    assert masked_mean(white, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(white, mask).item() == pytest.approx(1.0, abs=1e-5)
    assert (white[~mask] == 0).all()


def test_masked_whiten_keeps_mean_without_shift():
    gen = torch.Generator().manual_seed(1)
    values = 3.0 + 2.0 * torch.randn(4, 7, generator=gen)
    mask = torch.rand(4, 7, generator=gen) > 0.3
    white = masked_whiten(values, mask, shift_mean=False)
    assert masked_mean(white, mask).item() == pytest.approx(masked_mean(values, mask).item(), abs=1e-5)
    assert masked_var(white, mask).item() == pytest.approx(1.0, abs=1e-5)
    # by hand on kept [1, 2, 3] (mean 2, unbiased std 1): (x - 2) / 1 + 2 = x
    torch.testing.assert_close(masked_whiten(VALUES, MASK, shift_mean=False)[MASK], torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(masked_whiten(VALUES, MASK)[MASK], torch.tensor([-1.0, 0.0, 1.0]))
