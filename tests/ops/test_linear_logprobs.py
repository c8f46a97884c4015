"""The chunked output layer (`linear_token_logps`: logits recomputed chunk by chunk in backward)
against the dense logits: values, gradients, memory, bad arguments. Through a causal LM:
`tests/models/test_logprobs.py`."""

import pytest
import torch
import torch.nn.functional as F

from lit_rlhf.ops import linear_token_logps

V, H = 96, 32


def _dense(hidden, weight, bias, targets, temperature):
    z = F.linear(hidden, weight, bias) / temperature  # (N, V)
    return F.log_softmax(z, -1).gather(-1, targets[:, None]).squeeze(-1)


def _leaves(n, dtype=torch.float32, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=gen, dtype=dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=gen, dtype=dtype) / H**0.5).requires_grad_()
    b = torch.randn(V, generator=gen, dtype=dtype).requires_grad_() if bias else None
    targets = torch.randint(0, V, (n,), generator=gen)
    return hidden, weight, b, targets


@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_equal_the_dense_logits_fp32(bias):
    hidden, weight, b, targets = _leaves(23, bias=bias)
    leaves = [t for t in (hidden, weight, b) if t is not None]
    g_lp = torch.randn(23, generator=torch.Generator().manual_seed(1))
    # 23 rows in chunks of 5: the last chunk is partial
    logps = linear_token_logps(hidden, weight, b, targets, temperature=0.7, chunk_size=5)
    grads = torch.autograd.grad((logps * g_lp).sum(), leaves)
    ref_logps = _dense(hidden, weight, b, targets, 0.7)
    ref_grads = torch.autograd.grad((ref_logps * g_lp).sum(), leaves)
    assert logps.dtype == torch.float32
    torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=0)
    for got, want in zip(grads, ref_grads):  # hidden states, output weight (and bias)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_in_place_logsumexp_equals_torchs_bit_for_bit():
    from lit_rlhf.ops.linear_logprobs import _logsumexp_

    z = torch.randn(6, 1000, generator=torch.Generator().manual_seed(2)) * 30
    z[1, 7] = float("inf")  # a row with an infinite logit: lse = inf
    z[2] = float("-inf")  # a row of -inf only: lse = -inf
    z[3, :500] = float("-inf")
    want = torch.logsumexp(z, dim=-1)
    got = _logsumexp_(z.clone())
    assert torch.equal(got, want)


def test_one_chunk_of_logits_lives_at_a_time_in_forward_and_backward():
    """The largest buffers of the chunked path are (chunk, V) logits: the
    forward and the backward pass each hold one of them at a time (the log-sum-exp and the softmax
    are computed in the logits' own memory)."""
    vocab, hidden_size, chunk, n = 4096, 8, 16, 50
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, hidden_size, generator=gen).requires_grad_()
    weight = torch.randn(vocab, hidden_size, generator=gen).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=gen)
    chunk_bytes = chunk * vocab * 4
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        logps = linear_token_logps(hidden, weight, None, targets, chunk_size=chunk)
        logps.sum().backward()
    live, most = set(), 0
    for event in sorted((e for e in _allocations(prof)), key=lambda e: e.start_time_ns):
        size, ptr = event.typed[1].alloc_size, event.typed[1].ptr
        if size == chunk_bytes:
            live.add(ptr)
        elif size == -chunk_bytes:
            live.discard(ptr)
        most = max(most, len(live))
    assert most == 1


def _allocations(prof):
    from torch._C._profiler import _EventType

    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.typed[0] == _EventType.Allocation:
            yield node


def test_float64_gradcheck_with_temperature():
    gen = torch.Generator().manual_seed(3)
    hidden, weight, b = (torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_() for shape in ((7, 4), (9, 4), (9,)))
    targets = torch.randint(0, 9, (7,), generator=gen)

    def fn(h, w, bb):
        return linear_token_logps(h, w, bb, targets, temperature=1.3, chunk_size=3)

    assert torch.autograd.gradcheck(fn, (hidden, weight, b))


def test_bad_arguments_are_refused():
    hidden, weight, b, targets = _leaves(4)
    with pytest.raises(ValueError, match="temperature"):
        linear_token_logps(hidden, weight, b, targets, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_token_logps(hidden, weight, b, targets, chunk_size=0)
