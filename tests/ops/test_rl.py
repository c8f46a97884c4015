import math

import pytest
import torch

from lit_rlhf.ops import gae, kl_penalty, last_true_index, place_at_last, place_rewards, truncate_after_eos


def test_gae_by_hand_gamma1_lam095():
    # row 0 (3 tokens): r = [0, 0, 1], V = [0.5, 0.6, 0.7]
    #   t2: delta = 1 + 0 - 0.7 = 0.3;         A2 = 0.3
    #   t1: delta = 0 + 0.7 - 0.6 = 0.1;       A1 = 0.1 + 0.95 * 0.3   = 0.385
    #   t0: delta = 0 + 0.6 - 0.5 = 0.1;       A0 = 0.1 + 0.95 * 0.385 = 0.46575
    #   returns A + V = [0.96575, 0.985, 1.0]
    # row 1 (2 tokens, then padding with junk values): r = [0, 2], V = [0.2, 0.4]
    #   t1: delta = 2 + 0 - 0.4 = 1.6 (V past the end is 0); A1 = 1.6
    #   t0: delta = 0 + 0.4 - 0.2 = 0.2;       A0 = 0.2 + 0.95 * 1.6 = 1.72
    #   returns [1.92, 2.0, 0]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(adv, torch.tensor([[0.46575, 0.385, 0.3], [1.72, 1.6, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.96575, 0.985, 1.0], [1.92, 2.0, 0.0]]))


def test_gae_lambda1_is_monte_carlo():
    # gamma = lam = 1: A_t = sum_{s >= t} r_s - V_t, so returns are reward-to-go
    rewards = torch.tensor([[0.5, -1.0, 2.0, 0.25]])
    values = torch.tensor([[0.3, 0.1, -0.2, 0.4]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = torch.tensor([[1.75, 1.25, 2.25, 0.25]])
    torch.testing.assert_close(ret, to_go)
    torch.testing.assert_close(adv, to_go - values)


def test_gae_skips_environment_tokens_of_a_multi_turn_episode():
    # policy tokens at 0, 1 | environment tokens at 2, 3 (junk rewards and values) | policy 4 | pad 5
    # kept: r = [0, 0.5, ., ., 1], V = [0.5, 0.6, ., ., 0.8]; gamma = 1, lam = 0.95
    #   t4: delta = 1 + 0 - 0.8 = 0.2;            A4 = 0.2
    #   t1: delta = 0.5 + 0.8 - 0.6 = 0.7 (next kept value is V4); A1 = 0.7 + 0.95 * 0.2 = 0.89
    #   t0: delta = 0 + 0.6 - 0.5 = 0.1;          A0 = 0.1 + 0.95 * 0.89 = 0.9455
    #   returns A + V = [1.4455, 1.49, 0, 0, 1.0, 0]
    rewards = torch.tensor([[0.0, 0.5, 9.0, 9.0, 1.0, 9.0]])
    values = torch.tensor([[0.5, 0.6, 7.0, 7.0, 0.8, 7.0]])
    mask = torch.tensor([[True, True, False, False, True, False]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(adv, torch.tensor([[0.9455, 0.89, 0.0, 0.0, 0.2, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.4455, 1.49, 0.0, 0.0, 1.0, 0.0]]))
    # the same as GAE over the policy's tokens alone, packed together
    packed, _ = gae(rewards[:, [0, 1, 4]], values[:, [0, 1, 4]], torch.ones(1, 3, dtype=torch.bool), 1.0, 0.95)
    torch.testing.assert_close(adv[:, [0, 1, 4]], packed)


def test_place_rewards_keeps_turn_rewards_and_puts_the_rest_last():
    # row 0: turn rewards -0.5 (col 1) and 0.25 (col 3), score 2 -> the last kept token (col 4)
    # gets 2 - (-0.5 + 0.25) = 2.25; row 1: no turn reward -> the whole score on its last token
    scores = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[True, True, False, True, True, False], [True, True, True, False, False, False]])
    turns = torch.zeros(2, 6)
    turns[0, 1], turns[0, 3] = -0.5, 0.25
    out = place_rewards(scores, mask, turns)
    assert out.tolist() == [[0.0, -0.5, 0.0, 0.25, 2.25, 0.0], [0.0, 0.0, -1.0, 0.0, 0.0, 0.0]]
    torch.testing.assert_close(out.sum(dim=1), scores)
    torch.testing.assert_close(place_rewards(scores, mask), place_at_last(scores, mask))


def test_kl_estimators_by_hand():
    # log ratio = [1, -1]: k1 = [1, -1]; k2 = [0.5, 0.5]; k3 = e^{-lr} - 1 + lr = [e^-1, e - 2]
    logps, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])
    assert kl_penalty(logps, ref, "k1").tolist() == [1.0, -1.0]
    assert kl_penalty(logps, ref, "k2").tolist() == pytest.approx([0.5, 0.5])
    assert kl_penalty(logps, ref, "k3").tolist() == pytest.approx([math.exp(-1), math.e - 2], abs=1e-6)
    assert (kl_penalty(torch.randn(100), torch.randn(100), "k3") >= 0).all()
    with pytest.raises(ValueError):
        kl_penalty(logps, ref, "k4")


def test_kl_estimators_unbiased_in_expectation():
    # For tokens drawn from pi, E[k1] = E[k3] = KL(pi || ref); computed exactly over a 3-token vocabulary.
    pi = torch.tensor([0.5, 0.3, 0.2])
    ref = torch.tensor([0.2, 0.3, 0.5])
    kl = (pi * (pi.log() - ref.log())).sum()
    for est in ("k1", "k3"):
        assert (pi * kl_penalty(pi.log(), ref.log(), est)).sum().item() == pytest.approx(kl.item(), abs=1e-6)


def test_truncate_after_eos_edge_cases():
    eos, pad = 2, 0
    ids = torch.tensor(
        [
            [2, 5, 6, 2],  # EOS first (and again later)
            [5, 6, 7, 2],  # EOS last
            [5, 6, 7, 8],  # no EOS
            [5, 2, 6, 2],  # several EOS: cut after the first
        ]
    )
    out, mask, has_eos = truncate_after_eos(ids, eos, pad)
    assert out.tolist() == [[2, 0, 0, 0], [5, 6, 7, 2], [5, 6, 7, 8], [5, 2, 0, 0]]
    assert mask.tolist() == [
        [True, False, False, False],
        [True, True, True, True],
        [True, True, True, True],
        [True, True, False, False],
    ]
    assert has_eos.tolist() == [True, True, False, True]


def test_place_at_last_and_last_true_index():
    mask = torch.tensor([[True, True, False], [True, True, True], [False, True, False]])
    assert last_true_index(mask).tolist() == [1, 2, 1]
    placed = place_at_last(torch.tensor([3.0, 4.0, -1.0]), mask)
    assert placed.tolist() == [[0.0, 3.0, 0.0], [0.0, 0.0, 4.0], [0.0, -1.0, 0.0]]
    with pytest.raises(ValueError):
        last_true_index(torch.tensor([[True, False], [False, False]]))
