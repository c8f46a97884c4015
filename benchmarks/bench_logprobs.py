"""Peak memory and time of the log-prob forward+backward: dense logits vs the chunked path.

    python -m benchmarks.bench_logprobs --model smollm2-135m-instruct --json benchmarks/results/logprobs_smollm2.json

Rows of `--prompt-length` prompt and `--completion-length` completion tokens (TL;DR text,
`common.token_rows`; the completion tokens are scored), `--batch-size` rows (2 = a DPO pair).
Each variant (`dense`, `chunked:<rows>` for every `--chunk-sizes` entry) runs in its own
subprocess, one after the other, so each peak is its own. Two scopes:

- `head`: the log-prob computation alone. The decoder's last hidden states are computed once
  (no grad) and made a leaf; a step is the log-probs of the completion tokens from them and the
  output layer, and the backward pass to the hidden states and the output weight. Dense =
  `lm_head` on the scored positions + `selective_log_softmax` (what `per_token_logps` does with
  `chunk_size=None`); chunked = `linear_token_logps`.
- `model`: `per_token_logps` on the whole model (decoder forward, log-probs, backward through
  every layer), the step a DPO/SFT update runs minus the loss and optimizer.

Per step: time, and the peak resident memory (`VmHWM` reset right before the step,
`common.StepPeaks`) minus the resident memory right before it (`extra_mb`: what the step
allocates on top of the weights, gradients and hidden states it starts with). float32,
`torch.set_num_threads(--threads)`. Report: medians over `--steps` after `--warmup` steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--prompt-length", type=int, default=256)
    p.add_argument("--completion-length", type=int, default=1024)
    p.add_argument("--chunk-sizes", default="256,1024", help="comma-separated rows per chunk of the chunked variants")
    p.add_argument("--scopes", default="head,model", help="head, model or both")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--in-process", action="store_true", help="run the variants in this process (smoke test)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "<scope>:<variant>"
    return p.parse_args(argv)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def run_worker(args: argparse.Namespace, scope: str, variant: str) -> dict:
    """One variant: warm-up + measured steps in this process; times and step memory."""
    from benchmarks.common import StepPeaks, token_rows
    from lit_rlhf import models
    from lit_rlhf.models.logprobs import per_token_logps
    from lit_rlhf.models.output_layer import forward_hidden
    from lit_rlhf.ops import linear_token_logps, selective_log_softmax

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    chunk = None if variant == "dense" else int(variant.split(":")[1])
    tokenizer = models.load_tokenizer(args.model)
    model = models.load_causal_lm(args.model, tokenizer, "float32")
    model.train()
    P, C = args.prompt_length, args.completion_length
    rows = token_rows(tokenizer, args.batch_size, P, C)
    ids = torch.tensor([r["prompt_ids"] + r["chosen_ids"] for r in rows])  # (B, P + C)
    attention = torch.ones_like(ids, dtype=torch.bool)
    loss_mask = attention.clone()
    loss_mask[:, :P] = False
    head = model.get_output_embeddings()
    if scope == "head":
        with torch.no_grad():
            hidden = forward_hidden(model.get_decoder(), ids, attention)[:, P - 1:-1].contiguous()  # (B, C, H)
        hidden.requires_grad_()
        targets = ids[:, P:]  # (B, C)

        def step() -> torch.Tensor:
            if chunk is None:
                logps = selective_log_softmax(head(hidden), targets)  # (B, C)
            else:
                logps = linear_token_logps(hidden.flatten(0, 1), head.weight, head.bias, targets.flatten(), chunk_size=chunk)
            return -logps.mean()
    else:

        def step() -> torch.Tensor:
            logps = per_token_logps(model, ids, attention, loss_mask, chunk_size=chunk)
            return -logps[loss_mask].mean()

    times, extra, peaks, losses = [], [], [], []
    for i in range(args.warmup + args.steps):
        before = _rss_mb()
        StepPeaks.start()
        started = time.perf_counter()
        loss = step()
        loss.backward()
        elapsed = time.perf_counter() - started
        StepPeaks.stop()
        if i >= args.warmup:
            times.append(elapsed)
            peaks.append(StepPeaks.peaks[-1])
            extra.append(StepPeaks.peaks[-1] - before)
            losses.append(float(loss.detach()))
        del loss
        model.zero_grad(set_to_none=False)  # gradients stay allocated: every step starts alike
        if scope == "head":
            hidden.grad = None
    return {
        "scope": scope, "variant": variant, "chunk_size": chunk,
        "time_s": statistics.median(times), "times_s": times,
        "step_peak_rss_mb": max(peaks), "extra_mb": statistics.median(extra), "extra_mb_all": extra,
        "loss": losses[0],
        "scored_tokens": int(loss_mask.sum()), "vocab": int(head.weight.shape[0]), "hidden": int(head.weight.shape[1]),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.worker:
        scope, variant = args.worker.split("/", 1)
        print(json.dumps(run_worker(args, scope, variant)))
        return {}
    load_start = os.getloadavg()
    variants = ["dense"] + [f"chunked:{int(c)}" for c in args.chunk_sizes.split(",") if c]
    results = []
    for scope in args.scopes.split(","):
        for variant in variants:
            if args.in_process:
                results.append(run_worker(args, scope, variant))
                continue
            cmd = [sys.executable, "-m", "benchmarks.bench_logprobs", *(argv if argv is not None else sys.argv[1:]),
                   "--worker", f"{scope}/{variant}"]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
            out = subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("worker", "json")} | {"json": str(args.json)},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_start": load_start},
        "torch": torch.__version__,
        "results": results,
    }
    print(f"{'scope':6} {'variant':13} {'time s':>8} {'step extra MiB':>15} {'step peak RSS MiB':>18} {'loss':>9}")
    for r in results:
        dense = next(d for d in results if d["scope"] == r["scope"] and d["variant"] == "dense")
        print(f"{r['scope']:6} {r['variant']:13} {r['time_s']:8.2f} {r['extra_mb']:15.0f} {r['step_peak_rss_mb']:18.0f} "
              f"{r['loss']:9.5f}  (extra x{r['extra_mb'] / max(dense['extra_mb'], 1e-9):.2f} of dense, "
              f"time x{r['time_s'] / dense['time_s']:.2f})")
    report["machine"]["loadavg_end"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
