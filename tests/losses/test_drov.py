import pytest
import torch

from lit_rlhf.losses import drov_loss


def test_drov_by_hand():
    # logratio = [-1 - -1.5, -2 - -1] = [0.5, -1]; tau = 2; V = [0.5, 0]; r = [1, -1]
    # residual r - V - tau*logratio = [1 - 0.5 - 1, -1 - 0 + 2] = [-0.5, 1]
    # L = value_loss = 0.5 * mean(0.25, 1) = 0.3125
    # policy_loss = mean(-(r - V) logpi + tau/2 logratio^2)
    #             = mean(-(0.5)(-1) + 0.25, -(-1)(-2) + 1) = mean(0.75, -1) = -0.125
    out = drov_loss(
        policy_logps=torch.tensor([-1.0, -2.0]),
        ref_logps=torch.tensor([-1.5, -1.0]),
        values=torch.tensor([0.5, 0.0]),
        rewards=torch.tensor([1.0, -1.0]),
        tau=2.0,
    )
    assert out.objective.item() == pytest.approx(0.3125)
    assert out.value_loss.item() == pytest.approx(0.3125)
    assert out.policy_loss.item() == pytest.approx(-0.125)
    assert out.loss.item() == pytest.approx(0.1875)
    assert out.logratio.item() == pytest.approx(-0.25)
    assert out.advantages.item() == pytest.approx(-0.25)
    assert out.residuals.item() == pytest.approx(0.25)
    assert out.values.item() == pytest.approx(0.25)


def _policy(tau: float):
    """A tiny parametrised policy: log pi(y_i|x_i) = A_i . w + c_i, so grad log pi_i = A_i."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(4, 3, generator=gen)  # (B, P)
    offsets = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    w = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)
    ref = torch.tensor([-1.2, -1.5, -1.0, -2.0])
    values = torch.tensor([0.1, -0.4, 0.3, 0.0], requires_grad=True)
    rewards = torch.tensor([1.0, -1.0, 0.5, -0.2])
    return features, offsets, w, ref, values, rewards


@pytest.mark.parametrize("tau", [0.3, 2.5])
def test_drov_policy_gradient_is_eq8_over_tau(tau):
    features, offsets, w, ref, values, rewards = _policy(tau)
    logps = features @ w + offsets
    out = drov_loss(logps, ref, values, rewards, tau)
    (grad_w,) = torch.autograd.grad(out.policy_loss, w, retain_graph=True)
    # expected: mean_i [-(r_i - V_i) + tau * logratio_i] * A_i   (tau/2 grad lr^2 = tau lr grad log pi)
    with torch.no_grad():
        logratio = logps - ref
        coef = -(rewards - values) + tau * logratio  # (B,)
        expected = (coef[:, None] * features).mean(0)
    assert torch.allclose(grad_w, expected, atol=1e-6)
    # ... which is the gradient of L = 1/2 mean (r - V - tau lr)^2 w.r.t. theta (Eq. 8) divided by tau
    full = 0.5 * ((rewards - values.detach() - tau * (logps - ref)) ** 2).mean()
    (grad_full,) = torch.autograd.grad(full, w, retain_graph=True)
    assert torch.allclose(grad_w, grad_full / tau, atol=1e-6)
    # the policy part never reaches the value network
    assert torch.autograd.grad(out.policy_loss, values, allow_unused=True)[0] is None


@pytest.mark.parametrize("tau", [0.3, 2.5])
def test_drov_value_gradient_is_eq7(tau):
    features, offsets, w, ref, values, rewards = _policy(tau)
    logps = features @ w + offsets
    out = drov_loss(logps, ref, values, rewards, tau)
    (grad_v,) = torch.autograd.grad(out.value_loss, values, retain_graph=True)
    expected = -(rewards - values.detach() - tau * (logps.detach() - ref)) / 4  # Eq. 7, batch mean
    assert torch.allclose(grad_v, expected, atol=1e-6)
    # the value part never reaches the policy
    assert torch.autograd.grad(out.value_loss, w, allow_unused=True)[0] is None
    # and loss = policy_loss + value_loss carries both
    g_w, g_v = torch.autograd.grad(out.loss, [w, values], retain_graph=True)
    assert torch.allclose(g_v, expected, atol=1e-6)
    assert torch.allclose(g_w, torch.autograd.grad(out.policy_loss, w)[0], atol=1e-6)


def _fit_tabular(tau: float, counts: torch.Tensor, steps: int = 300):
    """3 prompts x 4 responses; pi = softmax(theta[x]), V = v[x]. The dataset holds every (x, y)
    counts[x, y] times, i.e. the exact expectation under a behaviour policy mu(y|x) ∝ counts[x, y]
    (full support), so the minimiser is the population one of Theorem 1."""
    ref_logits = torch.tensor([[1.0, 0.0, -1.0, 0.5], [0.0, 0.0, 2.0, -1.0], [-0.5, 0.3, 0.1, 0.0]])
    ref_logps = torch.log_softmax(ref_logits, -1)  # a fixed non-uniform pi_ref
    rewards = torch.tensor([[1.0, -1.0, 0.5, 0.0], [-0.5, 1.5, -1.0, 0.2], [0.3, 0.3, -2.0, 1.0]])
    x, y = torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")
    x = x.reshape(-1).repeat_interleave(counts.reshape(-1))
    y = y.reshape(-1).repeat_interleave(counts.reshape(-1))
    theta = torch.zeros(3, 4, requires_grad=True)
    v = torch.zeros(3, requires_grad=True)
    opt = torch.optim.Adam([theta, v], lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(steps):
        logps = torch.log_softmax(theta, -1)
        out = drov_loss(logps[x, y], ref_logps[x, y], v[x], rewards[x, y], tau)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        sched.step()
    # Theorem 1: pi*(y|x) ∝ pi_ref(y|x) exp(r(x,y)/tau), V*(x) = tau log E_{pi_ref}[exp(r/tau)]
    pi_star = torch.softmax(ref_logps + rewards / tau, -1)
    v_star = tau * torch.logsumexp(ref_logps + rewards / tau, -1)
    return torch.softmax(theta.detach(), -1), v.detach(), pi_star, v_star, out


@pytest.mark.parametrize(
    "tau, counts",
    [
        (1.0, torch.ones(3, 4, dtype=torch.long)),  # uniform behaviour policy
        (0.5, torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1], [2, 1, 1, 3]])),  # non-uniform mu
        (2.0, torch.tensor([[3, 1, 1, 2], [1, 1, 4, 1], [1, 2, 1, 1]])),
    ],
)
def test_drov_reaches_theorem1_optimum(tau, counts):
    pi, v, pi_star, v_star, out = _fit_tabular(tau, counts)
    assert torch.allclose(pi, pi_star, atol=1e-4), (pi, pi_star)
    assert torch.allclose(v, v_star, atol=1e-4), (v, v_star)
    assert out.objective.item() < 1e-8  # every residual r - V - tau log(pi/pi_ref) vanishes


def test_batch_value_estimate_by_hand():
    from lit_rlhf.losses import batch_value_estimate

    # logratio = [-1 - -1.5, -2 - -1] = [0.5, -1]; tau = 2; r = [1, -1]
    # r - tau * logratio = [1 - 1, -1 + 2] = [0, 1]: V = 0.5 for both rows
    policy = torch.tensor([-1.0, -2.0], requires_grad=True)
    values = batch_value_estimate(policy, torch.tensor([-1.5, -1.0]), torch.tensor([1.0, -1.0]), tau=2.0)
    assert values.tolist() == [0.5, 0.5]
    assert not values.requires_grad  # held fixed: no gradient into the policy through V
    # it is the constant minimising the batch's L: residuals [0 - 0.5, 1 - 0.5] average to 0, and
    # L = 1/2 mean(0.25, 0.25) = 0.125 is below L at V = 0.5 +- 0.1: 1/2 mean(0.36, 0.16) = 0.13
    out = drov_loss(policy, torch.tensor([-1.5, -1.0]), values, torch.tensor([1.0, -1.0]), tau=2.0)
    assert out.residuals.item() == pytest.approx(0.0)
    assert out.objective.item() == pytest.approx(0.125)
    for shift in (-0.1, 0.1):
        other = drov_loss(policy, torch.tensor([-1.5, -1.0]), values + shift, torch.tensor([1.0, -1.0]), tau=2.0)
        assert other.objective.item() == pytest.approx(0.13)
    with pytest.raises(ValueError, match="tau"):
        batch_value_estimate(policy, policy, policy, tau=0.0)
