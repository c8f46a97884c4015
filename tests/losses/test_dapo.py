"""DAPO's dynamic-sampling group filter (Yu et al. 2025, Eq. 11) against hand-made scores."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.losses.dapo import informative_groups


def test_informative_groups_drop_zero_variance():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.3, 0.2])
    assert informative_groups(scores, 2).tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match="group_size"):
        informative_groups(scores, 3)
