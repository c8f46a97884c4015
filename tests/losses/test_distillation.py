"""On-policy distillation losses (`lit_rlhf.losses.distillation`): every value worked out by hand on
distributions of two to four outcomes.

Teacher P = [1/2, 1/2], student Q = [9/10, 1/10] (the running example):
  forward  KL(P || Q) = 1/2 ln(5/9) + 1/2 ln 5 = ln(5/3)
  reverse  KL(Q || P) = 9/10 ln(9/5) + 1/10 ln(1/5)
"""

import math

import pytest
import torch

from lit_rlhf.losses.distillation import (
    chunked_gkd_loss,
    distillation_pg_loss,
    generalized_jsd,
    gkd_loss,
    reverse_kl_advantages,
    topk_buckets,
)

P = torch.tensor([0.5, 0.5]).log()  # teacher
Q = torch.tensor([0.9, 0.1]).log()  # student
FORWARD = math.log(5 / 3)
REVERSE = 0.9 * math.log(9 / 5) + 0.1 * math.log(1 / 5)


# ------------------------------------------------------------------------------------------------
# the supervised form: generalized JSD
# ------------------------------------------------------------------------------------------------


def test_beta_0_is_the_forward_kl_teacher_to_student_and_beta_1_the_reverse():
    assert FORWARD != pytest.approx(REVERSE)  # the two directions differ here: a swap is caught
    assert float(generalized_jsd(Q, P, beta=0.0)) == pytest.approx(FORWARD)  # KL(teacher || student)
    assert float(generalized_jsd(Q, P, beta=1.0)) == pytest.approx(REVERSE)  # KL(student || teacher)


def test_beta_between_is_the_mixture_formula():
    # beta = 1/4: m = 1/4 P + 3/4 Q = [0.8, 0.2]
    # KL(P || m) = 1/2 ln(5/8) + 1/2 ln(5/2) = ln(5/4); KL(Q || m) = 9/10 ln(9/8) + 1/10 ln(1/2)
    expected = 0.25 * math.log(5 / 4) + 0.75 * (0.9 * math.log(9 / 8) + 0.1 * math.log(1 / 2))
    assert float(generalized_jsd(Q, P, beta=0.25)) == pytest.approx(expected)
    # beta weighs the teacher: the other reading (m = 1/4 Q + 3/4 P = [0.6, 0.4]) gives another value
    swapped = 0.25 * (0.9 * math.log(9 / 6) + 0.1 * math.log(1 / 4)) + 0.75 * (0.5 * math.log(5 / 6) + 0.5 * math.log(5 / 4))
    assert expected != pytest.approx(swapped)


def test_small_beta_behaves_like_the_forward_kl():
    """JSD(beta) / beta -> KL(P || Q) as beta -> 0 (why beta = 0 is the forward KL)."""
    beta = 1e-4
    assert float(generalized_jsd(Q.double(), P.double(), beta)) / beta == pytest.approx(FORWARD, rel=1e-3)


def test_gkd_loss_is_a_mean_over_tokens_not_over_sequences():
    # row 0: one token (student Q, teacher P); row 1: three tokens where student == teacher, and a
    # padded fourth token with a wild student that the mask drops
    student = torch.stack([torch.stack([Q, Q, Q, Q]), torch.stack([P, P, P, torch.tensor([0.999, 0.001]).log()])])
    teacher = P.expand(2, 4, 2)
    mask = torch.tensor([[True, False, False, False], [True, True, True, False]])
    out = gkd_loss(student, teacher, mask, beta=0.0)
    assert float(out.loss) == pytest.approx(FORWARD / 4)  # 4 tokens; a mean of sequence means is FORWARD / 2
    assert out.divergence[0, 0] == pytest.approx(FORWARD) and out.divergence[0, 1:].abs().sum() == 0
    assert float(out.tail_mass) == 0.0


def close(actual, expected, **kw):
    torch.testing.assert_close(actual.double(), torch.as_tensor(expected, dtype=torch.float64), **kw)


def _random_logps(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * 2).log_softmax(-1)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_topk_with_every_token_equals_the_full_vocabulary(beta):
    student = _random_logps(2, 3, 6, seed=1).requires_grad_()
    teacher = _random_logps(2, 3, 6, seed=2)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    full = gkd_loss(student, teacher, mask, beta)
    (grad_full,) = torch.autograd.grad(full.loss, student)
    values, ids = teacher.topk(6, dim=-1)
    bucketed = gkd_loss(student, values, mask, beta, teacher_topk_ids=ids)
    (grad_bucketed,) = torch.autograd.grad(bucketed.loss, student)
    assert float(bucketed.loss.detach()) == pytest.approx(float(full.loss.detach()), abs=1e-9)
    assert torch.allclose(grad_bucketed, grad_full, atol=1e-9)


def test_topk_buckets_by_hand():
    teacher = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    student = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    values, ids = teacher.topk(2)
    s, t = topk_buckets(student, values, ids)
    assert s.exp().tolist() == pytest.approx([0.1, 0.2, 0.7])  # the tail: 0.3 + 0.4
    assert t.exp().tolist() == pytest.approx([0.5, 0.3, 0.2])  # the tail: 1 - 0.8
    out = gkd_loss(student[None, None], values[None, None], torch.ones(1, 1, dtype=torch.bool), 0.0, ids[None, None])
    forward = 0.5 * math.log(0.5 / 0.1) + 0.3 * math.log(0.3 / 0.2) + 0.2 * math.log(0.2 / 0.7)
    assert float(out.loss) == pytest.approx(forward)
    assert float(out.tail_mass) == pytest.approx(0.2)
    # k = 1: buckets [0.5, 0.5] and [0.1, 0.9]; reverse KL(student || teacher)
    values, ids = teacher.topk(1)
    out = gkd_loss(student[None, None], values[None, None], torch.ones(1, 1, dtype=torch.bool), 1.0, ids[None, None])
    assert float(out.loss) == pytest.approx(0.1 * math.log(0.1 / 0.5) + 0.9 * math.log(0.9 / 0.5))


def test_gkd_gradient_moves_the_student_toward_the_teacher():
    logits = torch.tensor([[[2.0, 0.0]]], requires_grad=True)  # student puts most mass on token 0
    for beta in (0.0, 0.5, 1.0):
        loss = gkd_loss(logits.log_softmax(-1), P[None, None], torch.ones(1, 1, dtype=torch.bool), beta).loss
        (grad,) = torch.autograd.grad(loss, logits)
        assert grad[0, 0, 0] > 0 > grad[0, 0, 1], beta  # descent lowers token 0's logit, raises token 1's


# ------------------------------------------------------------------------------------------------
# the policy-gradient form
# ------------------------------------------------------------------------------------------------

STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.1, -3.0]])
TEACHER = torch.tensor([[-0.5, -3.0, -0.5], [-0.2, -1.1, -9.0]])
MASK = torch.tensor([[True, True, False], [True, True, True]])


def test_advantage_is_minus_student_minus_teacher_and_its_discounted_return():
    # r = -(student - teacher) on the mask: [0.5, -1, 0 (pad)], [0, -1, -6]
    close(reverse_kl_advantages(STUDENT, TEACHER, MASK), [[0.5, -1.0, 0.0], [0.0, -1.0, -6.0]])
    # gamma 1/2: A_t = r_t + 1/2 A_{t+1}
    close(reverse_kl_advantages(STUDENT, TEACHER, MASK, gamma=0.5), [[0.5 - 0.5, -1.0, 0.0], [0.0 - 0.5 - 1.5, -1.0 - 3.0, -6.0]])
    close(reverse_kl_advantages(STUDENT, TEACHER, MASK, gamma=1.0)[1], [-7.0, -7.0, -6.0])


def test_pg_loss_is_reinforce_with_a_fixed_advantage_over_the_tokens():
    logps = STUDENT.clone().requires_grad_()
    out = distillation_pg_loss(logps, TEACHER, MASK)
    advantages = torch.tensor([[0.5, -1.0, 0.0], [0.0, -1.0, -6.0]])
    assert float(out.loss.detach()) == pytest.approx(float(-(advantages * STUDENT).sum() / 5))  # 5 tokens, not 2 rows
    (grad,) = torch.autograd.grad(out.loss, logps)
    close(grad, -advantages / 5)  # no gradient through the advantage
    assert float(out.reverse_kl) == pytest.approx((-0.5 + 1.0 + 0.0 + 1.0 + 6.0) / 5)


def test_pg_gradient_in_expectation_is_the_reverse_kl_gradient():
    """Exact expectation over the sampled token of a 3-token student: E_y[grad L(y)] = grad KL(Q || P)."""
    theta = torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64).log()
    logq = theta.log_softmax(-1)
    expected = sum(logq[y].exp().detach() * distillation_pg_loss(logq[y].view(1, 1), teacher[y].view(1, 1),
                                                                 torch.ones(1, 1, dtype=torch.bool)).loss
                   for y in range(3))
    (pg,) = torch.autograd.grad(expected, theta, retain_graph=True)
    (reverse,) = torch.autograd.grad((logq.exp() * (logq - teacher)).sum(), theta, retain_graph=True)
    (forward,) = torch.autograd.grad((teacher.exp() * (teacher - logq)).sum(), theta)
    assert torch.allclose(pg, reverse)
    assert not torch.allclose(pg, forward, atol=1e-3)


def test_task_reward_and_reference_penalty_add_to_the_advantage():
    logps = STUDENT.clone().requires_grad_()
    ref = torch.tensor([[-1.0, -1.0, -1.0], [-0.2, -0.6, -3.0]])
    out = distillation_pg_loss(logps, TEACHER, MASK, task_advantages=torch.tensor([2.0, -1.0]), reward_weight=0.5,
                               ref_logps=ref, kl_coef=0.1)
    # distillation [[0.5, -1], [0, -1, -6]] + 0.5 * [2, -1] per row - 0.1 * (student - ref), student - ref =
    # [[0, -1], [0, 0.5, 0]]
    advantages = torch.tensor([[0.5 + 1.0, -1.0 + 1.0 + 0.1, 0.0], [0.0 - 0.5, -1.0 - 0.5 - 0.05, -6.0 - 0.5]])
    (grad,) = torch.autograd.grad(out.loss, logps)
    close(grad, -advantages / 5)
    assert float(out.distill_advantage_mean) == pytest.approx((0.5 - 1.0 - 1.0 - 6.0) / 5)
    with pytest.raises(ValueError, match="task_advantages"):
        distillation_pg_loss(logps, TEACHER, MASK, reward_weight=1.0)


def test_without_a_teacher_only_the_task_and_reference_terms_remain():
    """GKD's supervised form adds its task reward and reference penalty through this loss, teacher None."""
    logps = STUDENT.clone().requires_grad_()
    out = distillation_pg_loss(logps, None, MASK, task_advantages=torch.tensor([2.0, -1.0]), reward_weight=0.5)
    (grad,) = torch.autograd.grad(out.loss, logps)
    close(grad, -torch.tensor([[1.0, 1.0, 0.0], [-0.5, -0.5, -0.5]]) / 5)
    assert float(out.reverse_kl) == 0.0 and float(out.distill_advantage_mean) == 0.0


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("top_k", [None, 3])
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_chunked_gkd_equals_the_dense_loss_and_its_gradients(beta, top_k, chunk_size):
    """From hidden states and output layers, a chunk of tokens at a time: the value, the per-token
    divergence, the sampled tokens' log-probs and the gradients of the hidden states, the weight
    and the bias equal `gkd_loss` on the full log-probabilities."""
    g = torch.Generator().manual_seed(0)
    B, T, H, Ht, V, temperature = 2, 5, 6, 4, 11, 0.7
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    t_hidden, t_weight, t_bias = (torch.randn(B, T, Ht, generator=g, dtype=torch.float64),
                                  torch.randn(V, Ht, generator=g, dtype=torch.float64), torch.randn(V, generator=g, dtype=torch.float64))
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)

    student = torch.log_softmax((hidden @ weight.T + bias) / temperature, dim=-1)
    teacher = torch.log_softmax((t_hidden @ t_weight.T + t_bias) / temperature, dim=-1)
    top = teacher.topk(top_k, dim=-1) if top_k else None
    dense = gkd_loss(student, teacher if top is None else top.values, mask, beta, None if top is None else top.indices)
    dense_grads = torch.autograd.grad(dense.loss, (hidden, weight, bias), retain_graph=True)

    out = chunked_gkd_loss(hidden, weight, bias, t_hidden, t_weight, t_bias, targets, mask, beta, temperature,
                           chunk_size, top_k)
    grads = torch.autograd.grad(out.loss, (hidden, weight, bias), retain_graph=True)
    torch.testing.assert_close(out.loss, dense.loss)
    torch.testing.assert_close(out.divergence, dense.divergence)
    torch.testing.assert_close(out.tail_mass, dense.tail_mass.to(out.tail_mass.dtype))
    for got, want in zip(grads, dense_grads):
        torch.testing.assert_close(got, want)
    picked = student.gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(out.student_logps, torch.where(mask, picked, 0.0))
    # the sampled tokens' log-probs carry the student's gradient too (a policy-gradient term on them)
    for got, want in zip(torch.autograd.grad(out.student_logps.sum(), (hidden, weight)),
                         torch.autograd.grad(torch.where(mask, picked, 0.0).sum(), (hidden, weight))):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(out.teacher_logps, torch.where(mask, teacher.gather(-1, targets[..., None]).squeeze(-1), 0.0))


def test_chunked_gkd_with_nothing_scored_is_zero_and_still_differentiable():
    hidden = torch.randn(1, 3, 4, requires_grad=True)
    out = chunked_gkd_loss(hidden, torch.randn(5, 4), None, torch.randn(1, 3, 4), torch.randn(5, 4), None,
                           torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.bool))
    out.loss.backward()
    assert out.loss.item() == 0.0 and hidden.grad is not None and not hidden.grad.any()


def test_distillation_pg_loss_weighs_each_token_by_its_importance_weight():
    """L = -sum(M * w * sg(A) * logp) / sum(M): the gradient on each token is -M w A / sum(M);
    weights of 1 give the unweighted loss."""
    logps = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[True, True, False]])
    weights = torch.tensor([[2.0, 0.5, 3.0]])
    advantages = -(logps.detach() - teacher)  # gamma 0: each token's own -KL sample
    out = distillation_pg_loss(logps, teacher, mask, is_weights=weights)
    (grad,) = torch.autograd.grad(out.loss, logps)
    expected = -(mask * weights * advantages) / mask.sum()
    torch.testing.assert_close(grad, expected)
    plain = distillation_pg_loss(logps, teacher, mask)
    torch.testing.assert_close(distillation_pg_loss(logps, teacher, mask, is_weights=torch.ones(1, 3)).loss, plain.loss)
    assert not torch.allclose(out.loss, plain.loss)
