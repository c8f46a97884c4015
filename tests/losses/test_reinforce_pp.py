"""REINFORCE++ (Hu et al. 2025): the k1 KL in the per-token reward, the group baseline, the
global token normalisation and the per-token clipped loss, against hand-computed values."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from lit_rlhf.losses.reinforce_pp import clipped_token_loss, normalize_token_advantages, reinforce_pp_advantages

log = math.log


def test_reinforce_pp_kl_in_the_token_reward_and_group_baseline():
    mask = torch.tensor([[True, True, True], [True, True, False]])
    old = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.5, 9.0]])  # the masked 9.0 is never summed
    ref = torch.zeros(2, 3)
    scores = torch.tensor([1.0, 0.0])
    adv = reinforce_pp_advantages(scores, mask, old, ref, kl_coef=0.5)
    # KL to go: row 1 [0.6, 0.5, 0.3], row 2 [0.5, 0.5]; A = r - 0.5 * to_go
    assert adv.flatten().tolist() == pytest.approx([0.7, 0.75, 0.85, -0.25, -0.25, 0.0])
    base = reinforce_pp_advantages(scores, mask, old, ref, kl_coef=0.5, group_size=2)  # r - group mean = +/-0.5, then the same KL to go
    assert base.flatten().tolist() == pytest.approx([0.2, 0.25, 0.35, -0.75, -0.75, 0.0])
    kept = [0.7, 0.75, 0.85, -0.25, -0.25]
    mean, std = statistics.mean(kept), statistics.stdev(kept)
    norm = normalize_token_advantages(adv, mask)
    assert norm[mask].tolist() == pytest.approx([(v - mean) / std for v in kept], rel=1e-5)
    assert norm[1, 2].item() == 0.0
    assert normalize_token_advantages(torch.ones(2, 3), mask).abs().sum().item() == 0.0
    assert reinforce_pp_advantages(scores, mask).tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]  # kl_coef 0


def test_clipped_token_loss_by_hand():
    mask = torch.tensor([[True, True]])
    logps = torch.tensor([[log(0.6), log(0.3)]])
    old = torch.tensor([[log(0.4), log(0.3)]])  # ratios 1.5 and 1
    adv = torch.tensor([[2.0, -1.0]])
    out = clipped_token_loss(logps, old, adv, mask, 0.2, 0.2)
    assert out.loss.item() == pytest.approx((-1.2 * 2.0 + 1.0) / 2)
    assert out.clipfrac_high.item() == 0.5
