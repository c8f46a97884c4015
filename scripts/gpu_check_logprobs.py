"""Chunked log-probs against the dense path, under bf16 autocast and in fp32 (one of the checks of
scripts/gpu_check.sh; runs on any device).

    python scripts/gpu_check_logprobs.py --device cuda --model smollm2-135m-instruct

`lit_rlhf.models.logprobs.per_token_logps` has two paths: dense (the model's logits, then a
log-softmax) and chunked (`chunk_size`: the last hidden states go through the output layer a few
positions at a time, `lit_rlhf.ops.linear_logprobs`). The same right-padded batch (random token
ids, a loss mask over each row's last tokens, D5) goes through both, with the model's weights in
fp32 as bf16-mixed training keeps them: in fp32, and under `torch.autocast(dtype=bfloat16)`. In fp32
the largest difference over the scored tokens (in nats) must stay within `--fp32-tol`. Under bf16
autocast both paths round every logit to bf16 (8 bits of mantissa), and on CUDA the two matmul
shapes run different kernels, whose float32 sums can round to neighbouring bf16 values: a logit
of magnitude in [16, 32) then moves by one bf16 step, 0.125. So the bf16 bound is counted in
those steps: the largest difference must stay within `--bf16-ulps` steps of the largest scored
logit (one for the target's logit, one for the log-sum-exp) and the mean difference within half a
step. The largest difference of the gradients of the summed log-probs with respect to the output
layer, relative to the largest gradient entry, must stay within `--fp32-tol` / `--bf16-grad-tol`.
A misaligned token or mask gives differences of whole nats.
Prints one line per precision and exits 1 when a difference is out of bounds.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch


def batch(vocab: int, rows: int, length: int, device: torch.device, seed: int = 0):
    """Right-padded random ids, attention mask and a loss mask over each row's last 40% (completion)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, length), generator=gen)
    lengths = torch.randint(length // 2, length + 1, (rows,), generator=gen)
    positions = torch.arange(length)
    attention = positions[None, :] < lengths[:, None]
    loss = attention & (positions[None, :] >= (lengths[:, None] * 0.6).long())
    ids = torch.where(attention, ids, torch.zeros_like(ids))
    return ids.to(device), attention.to(device), loss.to(device)


def bf16_step(magnitude: float) -> float:
    """The spacing of bf16 numbers at `magnitude` (8 significant bits: 2**(exponent - 7))."""
    return 2.0 ** (math.floor(math.log2(max(magnitude, 2.0**-126))) - 7)


def largest_scored_logit(model, ids, attention, loss) -> float:
    """max |logit| over the positions that predict a scored token (float32, no autocast)."""
    from lit_rlhf.models.output_layer import forward_logits

    with torch.no_grad():
        logits = forward_logits(model, ids, attention).float()[:, :-1]
    return float(logits[loss[:, 1:]].abs().max())


def compare(model, ids, attention, loss, chunk_size: int, autocast: bool) -> tuple[float, float, float]:
    """(max and mean |dense - chunked| over scored tokens, max |grad difference| of the output
    layer's weight relative to the largest dense gradient entry)."""
    from lit_rlhf.models.logprobs import per_token_logps

    head = model.get_output_embeddings().weight
    results = []
    for chunk in (None, chunk_size):
        model.zero_grad(set_to_none=True)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            logps = per_token_logps(model, ids, attention, loss, chunk_size=chunk)
        logps.float().sum().backward()
        results.append((logps.detach().float(), head.grad.detach().float().clone()))
    (dense, dense_grad), (chunked, chunked_grad) = results
    diff = (dense - chunked)[loss].abs()
    grad = float((dense_grad - chunked_grad).abs().max() / dense_grad.abs().max().clamp(min=1e-12))
    return float(diff.max()), float(diff.mean()), grad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument("--fp32-tol", type=float, default=1e-3)
    parser.add_argument("--bf16-ulps", type=float, default=2.0,
                        help="bound on the largest bf16 difference, in bf16 steps at the largest scored logit")
    parser.add_argument("--bf16-grad-tol", type=float, default=0.1)
    args = parser.parse_args(argv)

    from lit_rlhf.models import load_causal_lm

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    model = load_causal_lm(args.model).to(device).float().eval()  # fp32 weights, dropout off (D7)
    ids, attention, loss = batch(model.config.vocab_size, args.rows, args.length, device)
    step = bf16_step(largest_scored_logit(model, ids, attention, loss))
    where = f"{args.model} on {device}, chunk {args.chunk_size}, {int(loss.sum())} scored tokens"
    ok = True
    for name, autocast in (("fp32", False), ("bf16 autocast", True)):
        largest, mean, grad = compare(model, ids, attention, loss, args.chunk_size, autocast)
        if autocast:
            bound, mean_bound, grad_bound = args.bf16_ulps * step, step / 2, args.bf16_grad_tol
            tolerance = (f"tolerance {bound:g} = {args.bf16_ulps:g} bf16 steps of {step:g} at the largest scored logit, "
                         f"mean {mean_bound:g}, gradient {grad_bound:g}")
        else:
            bound = mean_bound = grad_bound = args.fp32_tol
            tolerance = f"tolerance {bound:g}"
        good = largest <= bound and mean <= mean_bound and grad <= grad_bound
        ok &= good
        print(f"{'ok' if good else 'FAIL'} {name}: max |dense - chunked| log-prob {largest:.3g} (mean {mean:.3g}), "
              f"output-layer gradient {grad:.3g} relative ({tolerance}; {where})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
