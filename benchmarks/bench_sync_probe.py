"""The weight-sync probe's gap for a healthy half-precision sync, measured (`lit_rlhf.generation.sync_check`).

    python -m benchmarks.bench_sync_probe --json benchmarks/results/sync_probe_cpu.json

A trainer and vLLM's CPU engine in the same dtype holding the same weights: the engine built from
the trainer (`VLLMEngine.from_policy`), the trainer moved by a pretend update, the engine synced
(`sync_weights`), then per probe seed the probe's |log pi_trainer - log pi_engine| over its scored
tokens (the trainer's side as the check computes it: `SyncProbe.logps`, the weights' own dtype,
autocast off), its mean (what the check bounds) and max, and the quantiles over every scored token.
Probes of the default shape (2 rows x 12 ids, 4 scored) and a larger one (8 x 40, 16 scored), 20
seeds each. Per model, bfloat16 and, for scale, float32; and for contrast a broken sync: the
update's `model.layers.0.mlp.down_proj` not sent. One subprocess per (model, dtype): one vLLM
engine per process.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

MODELS = ("smollm2-135m-instruct", "tiny-hd32")
PROBES = ({"rows": 2, "prompt": 8, "tokens": 4}, {"rows": 8, "prompt": 24, "tokens": 16})
SEEDS = tuple(range(20))
DROPPED = "model.layers.0.mlp.down_proj.weight"


def tiny_hd32(directory: Path) -> str:
    """The vLLM tests' tiny Llama (tests/vllm/conftest.py: head size 32, tied embeddings), saved."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_rlhf.models import load_tokenizer

    tokenizer = load_tokenizer("tiny-random-llama")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def gaps(engine, policy, probe) -> list[float]:
    """|trainer - engine| log-prob of each of the probe's scored tokens."""
    import torch
    from vllm import SamplingParams

    expected = probe.logps(policy)
    ids = probe.input_ids.tolist()
    outputs = engine.llm.generate([{"prompt_token_ids": row} for row in ids],
                                  SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False),
                                  use_tqdm=False)
    n = probe.tokens
    scored = torch.tensor([[out.prompt_logprobs[j][row[j]].logprob for j in range(len(row) - n, len(row))]
                           for out, row in zip(outputs, ids)])
    return (scored - expected).abs().flatten().tolist()


def summary(values: list[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "max": max(values)}


def worker(model: str, dtype: str) -> dict[str, Any]:
    import tempfile

    import torch

    from lit_rlhf.generation.sync_check import SyncProbe
    from lit_rlhf.generation.vllm import VLLMEngine, gathered_parameters
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    torch.set_num_threads(2)
    workdir = tempfile.TemporaryDirectory()
    path = tiny_hd32(Path(workdir.name)) if model == "tiny-hd32" else model
    tokenizer = load_tokenizer(path)
    policy = load_causal_lm(path, tokenizer, dtype=dtype).eval()
    engine = VLLMEngine.from_policy(policy, tokenizer, max_model_len=256)
    engine.probe = None  # the gaps are read here, not checked
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a pretend update: every weight moved by 1% of its tensor's spread
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 0.01 * p.float().std().to(p.dtype))
    probes = [(shape, seed, SyncProbe(len(tokenizer), seed=seed, **shape)) for shape in PROBES for seed in SEEDS]
    engine.load_weights([(n, t) for n, t in gathered_parameters(policy) if n != DROPPED], partial=True)
    broken = [summary(gaps(engine, policy, probe)) for _, _, probe in probes]
    engine.sync_weights(policy, step=1)
    healthy, all_gaps = [], []
    for shape, seed, probe in probes:
        all_gaps += gaps(engine, policy, probe)
        healthy.append(dict(probe=shape, seed=seed, **summary(all_gaps[-probe.input_ids.shape[0] * probe.tokens:])))
    tokens = torch.tensor(all_gaps).quantile(torch.tensor([0.5, 0.9, 0.99]))
    return {"model": model, "dtype": dtype, "healthy": healthy, "dropped_tensor": broken,
            "healthy_mean_max": max(r["mean"] for r in healthy), "healthy_max": max(r["max"] for r in healthy),
            "healthy_token_p50_p90_p99": tokens.tolist(), "dropped_tensor_mean_min": min(r["mean"] for r in broken)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "DTYPE"), help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(*args.worker)), flush=True)
        return
    import torch
    import vllm

    runs = []
    for model in args.models:
        for dtype in ("bfloat16", "float32"):
            out = subprocess.run([sys.executable, "-m", "benchmarks.bench_sync_probe", "--worker", model, dtype],
                                 capture_output=True, text=True, check=True, env={**os.environ})
            runs.append(json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:]))
            r = runs[-1]
            print(f"{model} {dtype}: healthy mean <= {r['healthy_mean_max']:.3g}, max {r['healthy_max']:.3g} nats; "
                  f"dropped tensor mean >= {r['dropped_tensor_mean_min']:.3g}", flush=True)
    result = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "command":
              "python -m benchmarks.bench_sync_probe --json " + str(args.json), "cores": os.cpu_count(),
              "torch": torch.__version__, "vllm": vllm.__version__, "platform": platform.platform(), "runs": runs}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
