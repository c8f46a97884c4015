"""Peak training-step memory at a long-completion shape, ours vs TRL, without and with gradient
checkpointing, for SFT, DPO, GRPO and PPO, with a by-phase estimate of where the memory goes.

    python -m benchmarks.bench_memory --model smollm2-135m-instruct --json benchmarks/results/memory.json

Each (method, gradient checkpointing) cell runs the method's benchmark script
(`bench_memory_sft`, `bench_dpo`, `bench_grpo`, `bench_ppo`) once per framework, one process at
a time (the largest run needs ~10 GB: `--min-free-gb` waits for that much available memory
before each), with `--batch-size 1` (1 pair for DPO, 1 prompt x `--generations` 2 for GRPO, 1
prompt for PPO), `--prompt-length 256 --completion-length 1024`, `--warmup 1 --steps 1` (from
the second step on the optimizer states exist), `--no-bare`, float32 on CPU.
The memory is `StepPeaks`' (benchmarks/common.py): the larger resident-memory high-water mark of
the two training steps, each reset just before its step, so model loading does not count.

The by-phase estimate per cell (ours): weights, gradients and AdamW's two moments of the trained
model (4, 4 and 8 bytes per parameter, float32), the frozen models a step holds (DPO/GRPO/PPO:
the reference, 4 bytes per parameter; PPO: the reward model too, and the value model trained
like the policy), and the rest of the step peak: activations, logits, temporaries and the
process's runtime (Python, torch and the libraries: ~550 MiB, the whole peak of a tiny model). For scale
it prints the size of one dense float32 logits tensor at the shape (rows x T x vocabulary).

Goals: ours <= 0.85 x TRL without gradient checkpointing, <= 0.6 x TRL with it (both sides).
GRPO/PPO sample their completions, so a row can stop at EOS before `--completion-length`; both
sides sample with the same settings (the reports give the mean length).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {"sft": "benchmarks.bench_memory_sft", "dpo": "benchmarks.bench_dpo", "grpo": "benchmarks.bench_grpo",
           "ppo": "benchmarks.bench_ppo"}
GOALS = {False: 0.85, True: 0.6}
MiB = 1024 * 1024


def available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024 / 1024
    return float("inf")


def wait_for_memory(min_gb: float, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while available_gb() < min_gb:
        if time.monotonic() > deadline:
            raise SystemExit(f"less than {min_gb} GB of memory available for {timeout:.0f} s; not starting a run")
        time.sleep(10)


def run_cell(method: str, gc: bool, args: argparse.Namespace, framework: str) -> dict:
    """One framework's run of one cell; the benchmark script's JSON result."""
    wait_for_memory(args.min_free_gb)
    python = args.trl_python[method] if framework == "trl" else sys.executable
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [python, "-m", SCRIPTS[method], "--model", args.model, "--batch-size", "1",
               "--prompt-length", str(args.prompt_length), "--completion-length", str(args.completion_length),
               "--warmup", "1", "--steps", "1", "--rounds", "1", "--no-bare", "--threads", str(args.threads),
               "--frameworks", framework, "--json", str(out)]
        if gc:
            cmd.append("--gradient-checkpointing")
        if method == "grpo":
            cmd += ["--generations", str(args.generations)]
        print(f"[memory] {method} gc={gc} {framework}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            return {"error": f"exit {proc.returncode}: {proc.stderr[-3000:]}"}
        return json.loads(out.read_text())["frameworks"][framework]


def parameter_counts(model: str) -> tuple[int, int, int]:
    """(parameters, vocabulary size, hidden size) of the model (the policy)."""
    from lit_rlhf import models

    tokenizer = models.load_tokenizer(model)
    lm = models.load_causal_lm(model, tokenizer, "float32")
    return sum(p.numel() for p in lm.parameters()), lm.config.vocab_size, lm.config.hidden_size


def phases(method: str, params: int, peak_mb: float) -> dict[str, float]:
    """By-phase estimate (MiB) of our step peak (see the module docstring)."""
    w = 4 * params / MiB
    out = {"weights": w, "grads": w, "adam": 2 * w}
    if method in ("dpo", "grpo", "ppo"):
        out["reference"] = w
    if method == "ppo":  # value model (trained, from the reward model) and the frozen reward model
        out["value_weights_grads_adam"] = 4 * w
        out["reward_model"] = w
    out["activations_logits_runtime"] = peak_mb - sum(out.values())
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--methods", default="sft,dpo,grpo,ppo")
    parser.add_argument("--gc", default="off,on", help="gradient checkpointing settings to run: off, on or off,on")
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--completion-length", type=int, default=1024)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frameworks", default="ours,trl")
    parser.add_argument("--trl-venv", default="/tmp/benchvenv", help="python environment with TRL (SFT, DPO, GRPO)")
    parser.add_argument("--trl-ppo-venv", default="/tmp/benchvenv-ppo", help="python environment with TRL's PPO")
    parser.add_argument("--min-free-gb", type=float, default=12.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    args.trl_python = {m: str(Path(args.trl_ppo_venv if m == "ppo" else args.trl_venv) / "bin" / "python") for m in SCRIPTS}
    params, vocab, hidden = parameter_counts(args.model)
    seq = args.prompt_length + args.completion_length
    result: dict = {"model": args.model, "parameters": params, "vocab": vocab, "hidden": hidden,
                    "prompt_length": args.prompt_length, "completion_length": args.completion_length,
                    "load_average_before": os.getloadavg(), "cells": []}
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        rows = {"sft": 1, "dpo": 2, "grpo": args.generations, "ppo": 1}[method]
        for gc in [s.strip() == "on" for s in args.gc.split(",") if s.strip()]:
            cell = {"method": method, "gradient_checkpointing": gc, "rows": rows,
                    "dense_logits_mb": rows * seq * vocab * 4 / MiB}
            for fw in frameworks:
                cell[fw] = run_cell(method, gc, args, fw)
            ours, trl = cell.get("ours", {}), cell.get("trl", {})
            if "peak_rss_mb" in ours:
                cell["phases_mb"] = phases(method, params, ours["peak_rss_mb"])
            if "peak_rss_mb" in ours and "peak_rss_mb" in trl:
                cell["ours_over_trl"] = ours["peak_rss_mb"] / trl["peak_rss_mb"]
                cell["goal"] = GOALS[gc]
                cell["goal_met"] = cell["ours_over_trl"] <= GOALS[gc]
            result["cells"].append(cell)
            print(format_cell(cell), flush=True)
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(result, indent=2, default=float))
    result["load_average_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=float))
    return result


def format_cell(cell: dict) -> str:
    def peak(fw: str) -> str:
        entry = cell.get(fw, {})
        return f"{entry['peak_rss_mb']:.0f} MiB" if "peak_rss_mb" in entry else ("error" if "error" in entry else "-")

    line = (f"{cell['method']:>4} gc={'on ' if cell['gradient_checkpointing'] else 'off'}: ours {peak('ours')}, "
            f"TRL {peak('trl')}")
    if "ours_over_trl" in cell:
        line += f", ours/TRL x{cell['ours_over_trl']:.2f} (goal <= {cell['goal']}: {'met' if cell['goal_met'] else 'MISSED'})"
    if "phases_mb" in cell:
        line += " | " + ", ".join(f"{k} {v:.0f}" for k, v in cell["phases_mb"].items())
    for fw in ("ours", "trl"):
        if "error" in cell.get(fw, {}):
            line += f"\n  {fw} failed: {cell[fw]['error'][-600:]}"
    return line


if __name__ == "__main__":
    main()
