import math

import pytest
import torch

from lit_rlhf.losses import dpo_loss

# Two pairs, beta = 0.5:
#   pair 0: log-ratios chosen (-1) - (-2) = 1, rejected (-3) - (-2) = -1 -> h = 2,  z = 1
#   pair 1: log-ratios chosen (-2) - (-2) = 0, rejected (-1) - (-3) = 2  -> h = -2, z = -1
PAIRS = dict(
    policy_chosen_logps=torch.tensor([-1.0, -2.0]),
    policy_rejected_logps=torch.tensor([-3.0, -1.0]),
    ref_chosen_logps=torch.tensor([-2.0, -2.0]),
    ref_rejected_logps=torch.tensor([-2.0, -3.0]),
)


def test_dpo_sigmoid_by_hand():
    # -log sigmoid(1) = log(1 + e^-1) = 0.3132617, -log sigmoid(-1) = log(1 + e) = 1.3132617
    out = dpo_loss(**PAIRS, beta=0.5, loss_type="sigmoid")
    assert out.losses.tolist() == pytest.approx([0.3132617, 1.3132617], abs=1e-6)
    assert out.loss.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.e)) / 2, abs=1e-6)
    # implicit rewards beta * log-ratio: chosen [0.5, 0], rejected [-0.5, 1]
    assert out.chosen_rewards.tolist() == pytest.approx([0.5, 0.0])
    assert out.rejected_rewards.tolist() == pytest.approx([-0.5, 1.0])
    assert out.margins.tolist() == pytest.approx([1.0, -1.0])
    assert out.accuracies.item() == 0.5


def test_dpo_hinge_by_hand():
    # max(0, 1 - z): z = 1 -> 0, z = -1 -> 2; mean 1
    out = dpo_loss(**PAIRS, beta=0.5, loss_type="hinge")
    assert out.losses.tolist() == pytest.approx([0.0, 2.0])
    assert out.loss.item() == pytest.approx(1.0)


def test_ipo_by_hand_and_paper_normalisation():
    # (2z - 1)^2: z = 1 -> 1, z = -1 -> 9; mean 5.
    # Paper form times 4 beta^2: 4 * 0.25 * (h - 1/(2*0.5))^2 = (2 - 1)^2 = 1 and (-2 - 1)^2 = 9.
    out = dpo_loss(**PAIRS, beta=0.5, loss_type="ipo")
    assert out.losses.tolist() == pytest.approx([1.0, 9.0])
    assert out.loss.item() == pytest.approx(5.0)
    # beta = 0.1, h = 3: z = 0.3, (0.6 - 1)^2 = 0.16 = 4 * 0.01 * (3 - 5)^2
    out = dpo_loss(torch.tensor([0.0]), torch.tensor([-3.0]), torch.tensor([0.0]), torch.tensor([0.0]), 0.1, "ipo")
    assert out.loss.item() == pytest.approx(0.16, abs=1e-6)
    assert out.loss.item() == pytest.approx(4 * 0.1**2 * (3.0 - 1 / (2 * 0.1)) ** 2, abs=1e-6)


def test_exponential_by_hand():
    # GPO exponential f(z) = exp(-z): z = 1 -> e^-1 = 0.3678794, z = -1 -> e = 2.7182818; mean cosh(1)
    out = dpo_loss(**PAIRS, beta=0.5, loss_type="exponential")
    assert out.losses.tolist() == pytest.approx([0.3678794, 2.7182818], abs=1e-6)
    assert out.loss.item() == pytest.approx(1.5430806, abs=1e-6)
    assert out.margins.tolist() == pytest.approx([1.0, -1.0])


def test_savage_by_hand():
    # GPO Savage f(z) = 1 / (1 + e^z)^2: z = 1 -> 1 / (1 + e)^2 = 0.0723295,
    # z = -1 -> 1 / (1 + e^-1)^2 = sigmoid(1)^2 = 0.5344466; mean 0.3033881. Bounded: f(-50) ~ 1
    out = dpo_loss(**PAIRS, beta=0.5, loss_type="savage")
    assert out.losses.tolist() == pytest.approx([0.0723295, 0.5344466], abs=1e-6)
    assert out.loss.item() == pytest.approx(0.3033881, abs=1e-6)
    far = dpo_loss(torch.tensor([-100.0]), torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([0.0]), 0.5, "savage")
    assert far.loss.item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(("loss_type", "d_dz"), [
    # f'(z) for z = 1 and z = -1: exponential -e^-z; Savage -2 sigmoid(-z)^2 sigmoid(z)
    ("exponential", (-math.exp(-1), -math.e)),
    ("savage", (-2 * (1 / (1 + math.e)) ** 2 * (math.e / (1 + math.e)),
                -2 * (math.e / (1 + math.e)) ** 2 * (1 / (1 + math.e)))),
])
def test_gpo_gradients_by_hand(loss_type, d_dz):
    # d/d policy_chosen of mean_b f(beta h_b) = beta * f'(z_b) / B, and minus that for rejected
    chosen = PAIRS["policy_chosen_logps"].clone().requires_grad_(True)
    rejected = PAIRS["policy_rejected_logps"].clone().requires_grad_(True)
    out = dpo_loss(chosen, rejected, PAIRS["ref_chosen_logps"], PAIRS["ref_rejected_logps"], 0.5, loss_type)
    out.loss.backward()
    assert chosen.grad.tolist() == pytest.approx([0.25 * d for d in d_dz], abs=1e-6)
    assert rejected.grad.tolist() == pytest.approx([-0.25 * d for d in d_dz], abs=1e-6)


def test_dpo_sigmoid_gradient_by_hand():
    # d/d policy_chosen of mean_b -log sigmoid(beta h_b) = -beta * sigmoid(-z_b) / B
    # pair 0 (z = 1): -0.5 * 0.2689414 / 2 ; pair 1 (z = -1): -0.5 * 0.7310586 / 2
    chosen = PAIRS["policy_chosen_logps"].clone().requires_grad_(True)
    rejected = PAIRS["policy_rejected_logps"].clone().requires_grad_(True)
    out = dpo_loss(chosen, rejected, PAIRS["ref_chosen_logps"], PAIRS["ref_rejected_logps"], beta=0.5)
    out.loss.backward()
    s0, s1 = 1 / (1 + math.e), math.e / (1 + math.e)
    assert chosen.grad.tolist() == pytest.approx([-0.25 * s0, -0.25 * s1], abs=1e-6)
    assert rejected.grad.tolist() == pytest.approx([0.25 * s0, 0.25 * s1], abs=1e-6)
    assert not out.chosen_rewards.requires_grad and not out.losses.requires_grad


def test_dpo_unknown_loss_type():
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(**PAIRS, beta=0.1, loss_type="robust")


def _fit_two_responses(loss_type: str, beta: float, p: float, ref_logps: torch.Tensor, steps: int = 300):
    """One prompt, two responses, pi = softmax(theta). Train on the *expected* loss:
    y1 is preferred with probability p, so E[loss] = p * f(beta h_12) + (1 - p) * f(beta h_21)."""
    theta = torch.zeros(2, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(steps):
        logps = torch.log_softmax(theta, dim=0)
        forward = dpo_loss(logps[:1], logps[1:], ref_logps[:1], ref_logps[1:], beta, loss_type)
        backward = dpo_loss(logps[1:], logps[:1], ref_logps[1:], ref_logps[:1], beta, loss_type)
        loss = p * forward.loss + (1 - p) * backward.loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return torch.log_softmax(theta.detach(), dim=0)


def test_dpo_reaches_bradley_terry_optimum():
    # Bradley-Terry preferences with r = (1, -0.5): p = sigmoid(1.5). The expected DPO loss
    # p * -log sig(z) + (1-p) * -log sig(-z) is minimised at sigmoid(z) = p, i.e.
    # z = beta * (logratio_1 - logratio_2) = r1 - r2 = 1.5, and pi*(y) ∝ pi_ref(y) exp(r(y) / beta).
    beta, r = 0.5, torch.tensor([1.0, -0.5])
    ref_logps = torch.log(torch.tensor([0.7, 0.3]))
    p = torch.sigmoid(r[0] - r[1]).item()
    logps = _fit_two_responses("sigmoid", beta, p, ref_logps)
    z = beta * ((logps[0] - ref_logps[0]) - (logps[1] - ref_logps[1]))
    assert z.item() == pytest.approx(1.5, abs=1e-4)
    expected = torch.softmax(ref_logps + r / beta, dim=0)
    assert torch.allclose(logps.exp(), expected, atol=1e-4)


def test_ipo_reaches_its_optimum():
    # Expected IPO loss p (2z - 1)^2 + (1 - p)(2z + 1)^2 has derivative 8z + 4(1 - 2p) = 0 at
    # z* = p - 1/2, i.e. h* = (p - 1/2) / beta (IPO paper: target 1/(2 beta) for a sure preference).
    beta, p = 0.25, 0.9
    ref_logps = torch.log(torch.tensor([0.4, 0.6]))
    logps = _fit_two_responses("ipo", beta, p, ref_logps)
    h = (logps[0] - ref_logps[0]) - (logps[1] - ref_logps[1])
    assert h.item() == pytest.approx((p - 0.5) / beta, abs=1e-4)


def test_exponential_reaches_half_the_logit():
    # E[loss] = p e^-z + (1 - p) e^z has derivative -p e^-z + (1 - p) e^z = 0 at
    # z* = 1/2 log(p / (1 - p)): half of DPO's optimum
    beta, p = 0.5, 0.8
    ref_logps = torch.log(torch.tensor([0.3, 0.7]))
    logps = _fit_two_responses("exponential", beta, p, ref_logps)
    z = beta * ((logps[0] - ref_logps[0]) - (logps[1] - ref_logps[1]))
    assert z.item() == pytest.approx(0.5 * math.log(p / (1 - p)), abs=1e-4)


def test_savage_reaches_the_logit():
    # E[loss] = p sigmoid(-z)^2 + (1 - p) sigmoid(z)^2; with sigmoid' = sigmoid(z) sigmoid(-z) the
    # derivative is 2 sigmoid(z) sigmoid(-z) [(1 - p) sigmoid(z) - p sigmoid(-z)] = 0 at
    # e^z = p / (1 - p): z* = log(p / (1 - p)), DPO's optimum (the Savage loss is proper)
    beta, p = 0.5, 0.8
    ref_logps = torch.log(torch.tensor([0.3, 0.7]))
    logps = _fit_two_responses("savage", beta, p, ref_logps)
    z = beta * ((logps[0] - ref_logps[0]) - (logps[1] - ref_logps[1]))
    assert z.item() == pytest.approx(math.log(p / (1 - p)), abs=1e-4)
