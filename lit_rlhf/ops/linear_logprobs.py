"""Token log-probs from hidden states and the output layer, a chunk of tokens at a time.

The output layer `z = (h W^T + b) / temperature` is applied to `chunk_size` rows at a time, each
chunk's logits reduced to the picked log-prob and freed, and recomputed chunk by chunk in
backward: the (N, V) logits never exist. For one row with `lse = logsumexp(z)`, `p = softmax(z)`,
target `y`:

    logp_y = z_y - lse                      d logp_y / dz = onehot(y) - p

and with `g = dL/dz / temperature`: `dL/dh = g W`, `dL/dW = g^T h`, `dL/db = sum_rows g`. Under
autocast the matmuls run in the autocast dtype, the softmax in float32. The idea of Liger-Kernel's
fused linear cross-entropy and Apple's cut cross-entropy, in plain torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.ops.sampling import apply_temperature, filters, keep_targets


def _chunk_logits(h: Tensor, w: Tensor, b: Tensor | None, temperature: float, acc: torch.dtype, targets: Tensor,
                  top_k: int, top_p: float) -> Tensor:
    """(c, H) -> (c, V) logits divided by the temperature (`apply_temperature`), in `acc` (float32
    or float64), top-k / top-p filtered as sampled with each target (c,) kept (`keep_targets`)."""
    z = apply_temperature(torch.nn.functional.linear(h.to(w.dtype), w, b).to(acc), temperature, inplace=True)
    return keep_targets(z, top_k, top_p, targets) if filters(top_k, top_p) else z


def _logsumexp_(z: Tensor) -> Tensor:
    """`torch.logsumexp(z, dim=-1)` computed in `z`'s own memory (z is overwritten): the same
    steps as torch's kernel (the row maximum, infinite maxima taken as 0, then
    `log(sum(exp(z - max))) + max`) without its (rows, V) temporary `z - max`."""
    m = z.amax(dim=-1, keepdim=True)  # (c, 1)
    m.masked_fill_(m.abs() == float("inf"), 0.0)
    return z.sub_(m).exp_().sum(dim=-1).log_().add_(m.squeeze(-1))


class LinearTokenLogps(torch.autograd.Function):
    """`log_softmax(z)[target]` with `z = (hidden W^T + b) / temperature`, computed and
    differentiated `chunk_size` rows at a time (the logits are recomputed in backward), `z` top-k /
    top-p filtered when they are set (the mask a constant of the logits).

    hidden (N, H), weight (V, H), bias (V,) or None, targets (N,) long -> logps (N,) float32
    (float64 for a float64 layer).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, compute_dtype, top_k, top_p):
        acc = torch.promote_types(compute_dtype, torch.float32)
        logps = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
        lses = torch.empty_like(logps)
        with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute_dtype)
            b = None if bias is None else bias.to(compute_dtype)
            for start in range(0, hidden.shape[0], chunk_size):
                rows = slice(start, start + chunk_size)
                z = _chunk_logits(hidden[rows], w, b, temperature, acc, targets[rows], top_k, top_p)  # (c, V)
                logps[rows] = z.gather(-1, targets[rows, None]).squeeze(-1)  # read before z is overwritten
                lses[rows] = _logsumexp_(z)  # in z's memory: one (c, V) buffer instead of two
                del z
        ctx.save_for_backward(hidden, weight, bias, targets, lses)
        ctx.settings = temperature, chunk_size, compute_dtype, top_k, top_p
        return logps.sub_(lses)

    @staticmethod
    def backward(ctx, grad_logps):
        hidden, weight, bias, targets, lses = ctx.saved_tensors
        temperature, chunk_size, compute_dtype, top_k, top_p = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]  # need_b is False without a bias
        acc = lses.dtype
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute_dtype)
            b = None if bias is None else bias.to(compute_dtype)
            for start in range(0, hidden.shape[0], chunk_size):
                rows = slice(start, start + chunk_size)
                h = hidden[rows]
                logp = _chunk_logits(h, w, b, temperature, acc, targets[rows], top_k, top_p).sub_(lses[rows, None])
                g_lp = grad_logps[rows, None].to(acc)  # (c, 1)
                g = logp.exp_().mul_(-g_lp)  # -p dL/dlogp, p = exp(log p) in place: one (c, V) buffer
                del logp
                g.scatter_add_(-1, targets[rows, None], g_lp)  # + onehot(y) * dL/dlogp
                # dL/d(h W^T + b) = dL/dz / temperature: the vector-Jacobian product of the linear
                # map apply_temperature is that same map
                g = apply_temperature(g, temperature, inplace=True)
                g_c = g.to(compute_dtype)
                if need_h:
                    grad_h[rows] = (g_c @ w).to(hidden.dtype)
                if need_w and g_c.dtype == acc:  # accumulate in place: no (V, H) temporary per chunk
                    grad_w.addmm_(g_c.t(), h.to(acc))
                elif need_w:
                    grad_w.add_((g_c.t() @ h.to(compute_dtype)).to(acc))
                if need_b:
                    grad_b.add_(g.sum(0))
                del g, g_c
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def linear_token_logps(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float = 1.0,
                       chunk_size: int = 256, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Log-probs (N,) of `targets` under `softmax((hidden W^T + b) / temperature)` (top-k / top-p
    filtered as sampled, `lit_rlhf.ops.sampling`), never holding more than `chunk_size` rows of
    logits. hidden (N, H), weight (V, H), bias (V,) or None, targets (N,)."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if hidden.ndim != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"expected hidden (N, H) and targets (N,), got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    device = hidden.device.type  # the matmuls run in the autocast dtype when autocast is on
    autocast = torch.is_autocast_enabled(device) and weight.dtype in (torch.float32, torch.bfloat16, torch.float16)
    dtype = torch.get_autocast_dtype(device) if autocast else weight.dtype
    return LinearTokenLogps.apply(hidden, weight, bias, targets, float(temperature), int(chunk_size), dtype, int(top_k),
                                  float(top_p))
