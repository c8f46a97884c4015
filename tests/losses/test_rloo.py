"""RLOO (Ahmadian et al. 2024): KL-penalised sequence rewards (`ops.kl_penalized_sequence_rewards`),
leave-one-out advantages, REINFORCE on the summed sequence log-prob, composed as
`RLOOModule.update` composes them; every value worked out by hand."""

import pytest
import torch

from lit_rlhf.losses import rloo_advantages, rloo_loss
from lit_rlhf.ops import kl_penalized_sequence_rewards

# two prompts, k = 2 responses each, up to 3 tokens (the last row has 2)
MASK = torch.tensor([[True, True, True], [True, True, True], [True, True, True], [True, True, False]])
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -1.0, -1.0], [-0.5, -0.5, -0.5], [-1.0, -1.0, -9.0]])
REF = torch.tensor([[-1.5, -1.0, -1.0], [-1.0, -1.0, -1.0], [-0.5, -1.0, -0.5], [-1.0, -2.0, 7.0]])
SCORES = torch.tensor([1.0, 0.0, 2.0, 2.0])


def rloo(logps, old_logps, ref_logps, scores, mask, group_size, kl_coef):
    """The three steps of `RLOOModule.update` on one batch: (loss, rewards, advantages, kl)."""
    rewards, kl = kl_penalized_sequence_rewards(scores, old_logps, ref_logps, mask, kl_coef)
    advantages = rloo_advantages(rewards, group_size)
    return rloo_loss(logps, advantages, mask), rewards, advantages, kl


def test_sequence_rewards_carry_the_summed_kl():
    rewards, kl = kl_penalized_sequence_rewards(SCORES, OLD, REF, MASK, kl_coef=0.1)
    # KL per sequence: 0.5 + 0 + 0 = 0.5; -1 + 0 + 0 = -1; 0 + 0.5 + 0 = 0.5; 0 + 1 (padding ignored) = 1
    assert kl.tolist() == pytest.approx([0.5, -1.0, 0.5, 1.0])
    assert rewards.tolist() == pytest.approx([1 - 0.05, 0 + 0.1, 2 - 0.05, 2 - 0.1])


def test_rloo_loss_and_gradient_by_hand():
    logps = OLD.clone().requires_grad_(True)
    loss, _, advantages, _ = rloo(logps, OLD, REF, SCORES, MASK, group_size=2, kl_coef=0.1)
    # rewards [0.95, 0.1, 1.95, 1.9]; with k = 2 the baseline is the other response's reward
    assert advantages.tolist() == pytest.approx([0.85, -0.85, 0.05, -0.05], abs=1e-6)
    # sequence log-probs (summed): -3, -4, -1.5, -2
    expected = -(0.85 * -3 + -0.85 * -4 + 0.05 * -1.5 + -0.05 * -2) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    # d loss / d logp_it = -A_i / N on kept tokens, 0 on padding: not length-normalised
    grad = torch.tensor([[-0.85] * 3, [0.85] * 3, [-0.05] * 3, [0.05, 0.05, 0.0]]) / 4
    torch.testing.assert_close(logps.grad, grad)


def test_equal_rewards_give_no_gradient_and_kl_coef_zero_needs_no_reference():
    logps = OLD.clone().requires_grad_(True)
    loss, _, advantages, kl = rloo(logps, OLD, None, torch.tensor([1.0, 1.0, 3.0, 3.0]), MASK, group_size=2, kl_coef=0.0)
    assert advantages.tolist() == [0.0, 0.0, 0.0, 0.0] and kl.tolist() == [0.0] * 4
    loss.backward()
    assert torch.count_nonzero(logps.grad) == 0
    with pytest.raises(ValueError, match="ref_logps"):
        kl_penalized_sequence_rewards(SCORES, OLD, None, MASK, kl_coef=0.1)


def test_k3_leave_one_out_baseline():
    # k = 3: A_i = r_i - mean of the other two
    adv = rloo(torch.zeros(3, 1), torch.zeros(3, 1), torch.zeros(3, 1), torch.tensor([3.0, 0.0, 6.0]),
               torch.ones(3, 1, dtype=torch.bool), group_size=3, kl_coef=0.5)[2]
    assert adv.tolist() == pytest.approx([0.0, -4.5, 4.5])
    assert rloo_loss(torch.ones(3, 1), adv, torch.ones(3, 1, dtype=torch.bool)).item() == pytest.approx(0.0)


# three groups of G = 3: [1, 2, 3], [5, 5, 5], [0, 0, 6]
REWARDS = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0, 0.0, 0.0, 6.0])


def test_rloo_advantages_by_hand():
    # [1, 2, 3]: baselines (2+3)/2, (1+3)/2, (1+2)/2 = 2.5, 2, 1.5 -> [-1.5, 0, 1.5] = 3/2 (r - 2)
    # [0, 0, 6]: baselines 3, 3, 0 -> [-3, -3, 6] = 3/2 [-2, -2, 4]
    adv = rloo_advantages(REWARDS, 3)
    assert adv.tolist() == pytest.approx([-1.5, 0.0, 1.5, 0.0, 0.0, 0.0, -3.0, -3.0, 6.0], abs=1e-6)
    assert (rloo_advantages(torch.tensor([0.1, 0.1, 0.1]), 3) == 0).all()
