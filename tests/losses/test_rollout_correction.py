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


# the rollout correction's modes, by hand. Per-token log-ratios l = train - sampler:
#   row 0: 0.5, -1.0, 0.0   (sum -0.5, mean -1/6)
#   row 1: -2.9, 2.9, (pad) (sum 0, mean 0)
TRAIN = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -7.0]])
SAMPLER = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -3.0, -9.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
e = math.exp


def correction(**kwargs):
    from lit_rlhf.losses import rollout_correction

    return rollout_correction(TRAIN, SAMPLER, MASK, **kwargs)


def test_token_truncate_is_tis():
    out = correction(mode="truncate", level="token", upper=2.0)
    assert torch.allclose(out.weights, torch.tensor([[e(0.5), e(-1.0), 1.0], [e(-2.9), 2.0, 1.0]]))
    assert torch.equal(out.keep, MASK)
    assert torch.equal(out.weights, truncated_importance_weights(TRAIN, SAMPLER, MASK, 2.0))


def test_token_mask_is_icepop_two_sided():
    # kept where 0.5 <= w <= 2: e^0.5 = 1.65 and 1 in row 0; e^-1 = 0.37, e^-2.9, e^2.9 dropped
    out = correction(mode="mask", level="token", lower=0.5, upper=2.0)
    assert torch.allclose(out.weights, torch.tensor([[e(0.5), e(-1.0), 1.0], [e(-2.9), e(2.9), 1.0]]))
    assert out.keep.tolist() == [[True, False, True], [False, False, False]]
    assert torch.allclose(out.factor(), torch.tensor([[e(0.5), 0.0, 1.0], [0.0, 0.0, 0.0]]))
    # lower unset: 1 / upper
    assert torch.equal(correction(mode="mask", level="token", upper=2.0).keep, out.keep)


def test_sequence_level_is_the_summed_log_ratio():
    # w_0 = e^-0.5 = 0.607, w_1 = e^0 = 1
    out = correction(mode="truncate", level="sequence", upper=0.9)
    assert torch.allclose(out.weights, torch.tensor([[e(-0.5)] * 3, [0.9, 0.9, 1.0]]))
    assert torch.equal(out.keep, MASK)
    masked = correction(mode="mask", level="sequence", lower=0.7, upper=1.5)  # TRL's sequence mask
    assert masked.keep.tolist() == [[False, False, False], [True, True, False]]
    assert torch.allclose(masked.weights, torch.tensor([[e(-0.5)] * 3, [1.0, 1.0, 1.0]]))


def test_geometric_level_is_the_mean_log_ratio():
    # w_0 = e^(-1/6) = 0.846, w_1 = 1
    out = correction(mode="truncate", level="geometric", upper=0.8)
    assert torch.allclose(out.weights, torch.tensor([[0.8] * 3, [0.8, 0.8, 1.0]]))
    kept = correction(mode="mask", level="geometric", lower=0.8, upper=1.2)
    assert torch.equal(kept.keep, MASK)
    assert torch.allclose(kept.weights, torch.tensor([[e(-1 / 6)] * 3, [1.0, 1.0, 1.0]]))
    assert correction(mode="mask", level="geometric", lower=0.9, upper=1.2).keep.tolist() == [[False] * 3, [True, True, False]]


def test_offpolicy_sequence_mask_drops_negative_advantage_high_kl_rows():
    # KL_i = mean(sampler - train): row 0 1/6 = 0.167, row 1 0
    both_negative = correction(mode="truncate", upper=2.0, advantages=torch.tensor([-1.0, -1.0]), offpolicy_kl=0.1)
    assert both_negative.keep.tolist() == [[False] * 3, [True, True, False]]
    positive = correction(mode="truncate", upper=2.0, advantages=torch.tensor([1.0, -1.0]), offpolicy_kl=0.1)
    assert torch.equal(positive.keep, MASK)  # a positive advantage is never dropped
    loose = correction(mode="truncate", upper=2.0, advantages=torch.tensor([-1.0, -1.0]), offpolicy_kl=0.2)
    assert torch.equal(loose.keep, MASK)  # 1/6 < 0.2
    per_token = correction(mode="truncate", upper=2.0, advantages=torch.tensor([[1.0, -1.0, 1.0], [-1.0] * 3]),
                           offpolicy_kl=0.1)
    assert per_token.keep.tolist() == [[True, False, True], [True, True, False]]
    with pytest.raises(ValueError, match="advantages"):
        correction(mode="truncate", upper=2.0, offpolicy_kl=0.1)


@pytest.mark.parametrize("mode,level,lower", [("truncate", "token", None), ("truncate", "sequence", None),
                                              ("truncate", "geometric", None), ("mask", "token", 0.5),
                                              ("mask", "sequence", 0.9), ("mask", "geometric", 0.99)])
def test_matched_engines_change_nothing(mode, level, lower):
    from lit_rlhf.losses import rollout_correction

    out = rollout_correction(TRAIN, TRAIN.clone(), MASK, mode=mode, level=level, upper=1.01, lower=lower,
                             advantages=torch.tensor([-1.0, -1.0]), offpolicy_kl=0.0)
    assert torch.equal(out.weights, torch.ones(2, 3)) and torch.equal(out.keep, MASK)


def test_huge_sequence_ratios_stay_finite():
    from lit_rlhf.losses import rollout_correction

    train, sampler, mask = torch.zeros(1, 200), torch.full((1, 200), -1.0), torch.ones(1, 200, dtype=torch.bool)
    out = rollout_correction(train, sampler, mask, mode="truncate", level="sequence", upper=3.0)  # sum 200
    assert torch.equal(out.weights, torch.full((1, 200), 3.0))
    dropped = rollout_correction(-train - 1, -sampler - 1, mask, mode="mask", level="sequence", upper=3.0)  # sum -200
    assert not dropped.keep.any() and torch.isfinite(dropped.weights).all()


def test_bad_settings():
    for kwargs, match in [(dict(mode="clip"), "mode"), (dict(level="row"), "level"), (dict(upper=0.0), "upper"),
                          (dict(mode="truncate", lower=0.5), "lower"), (dict(mode="mask", lower=3.0, upper=2.0), "lower"),
                          (dict(offpolicy_kl=-1.0, advantages=torch.ones(2)), "threshold")]:
        with pytest.raises(ValueError, match=match):
            correction(**kwargs)


def test_mismatch_stats_by_hand():
    from lit_rlhf.losses import mismatch_stats

    ratios = sorted([e(0.5), e(-1.0), 1.0, e(-2.9), e(2.9)])
    stats = mismatch_stats(TRAIN, SAMPLER, MASK, correction(mode="mask", level="token", lower=0.5, upper=2.0))
    assert stats.kl_k1.item() == pytest.approx(-(0.5 - 1.0 + 0.0 - 2.9 + 2.9) / 5)  # 0.1
    k3 = [e(x) - 1 - x for x in (0.5, -1.0, 0.0, -2.9, 2.9)]
    assert stats.kl_k3.item() == pytest.approx(sum(k3) / 5, rel=1e-6)
    assert stats.ratio_mean.item() == pytest.approx(sum(ratios) / 5, rel=1e-6)
    assert stats.ratio_min.item() == pytest.approx(e(-2.9), rel=1e-6)
    assert stats.ratio_max.item() == pytest.approx(e(2.9), rel=1e-6)
    assert stats.ratio_p50.item() == pytest.approx(1.0)
    # linear interpolation at position 0.05 * 4 = 0.2 (and 3.8) of the sorted ratios
    assert stats.ratio_p05.item() == pytest.approx(ratios[0] + 0.2 * (ratios[1] - ratios[0]), rel=1e-6)
    assert stats.ratio_p95.item() == pytest.approx(ratios[3] + 0.8 * (ratios[4] - ratios[3]), rel=1e-6)
    assert stats.masked_fraction.item() == pytest.approx(3 / 5)
    assert stats.weight_mean.item() == pytest.approx((e(0.5) + 1.0) / 2, rel=1e-6)
    plain = mismatch_stats(TRAIN, TRAIN, MASK)
    assert plain.kl_k1.item() == 0.0 and plain.kl_k3.item() == 0.0 and plain.ratio_max.item() == 1.0
    assert plain.masked_fraction.item() == 0.0 and plain.weight_mean.item() == 1.0


def test_quantiles_match_torch_without_its_size_limit():
    from lit_rlhf.losses.rollout_correction import sorted_quantiles

    x = torch.randn(1001, generator=torch.Generator().manual_seed(0))
    qs = (0.0, 0.05, 0.5, 0.95, 1.0)
    assert torch.allclose(sorted_quantiles(x, qs), torch.quantile(x, torch.tensor(qs)))
    assert sorted_quantiles(torch.ones(2 ** 24 + 1), (0.5,)).item() == 1.0  # torch.quantile refuses this size
