"""Peak training-step memory at a long-completion shape, ours vs TRL, without and with gradient
checkpointing, for SFT, DPO, GRPO and PPO, with a by-phase estimate of where the memory goes.

    python -m benchmarks.bench_memory --model smollm2-135m-instruct --json benchmarks/results/memory.json

Each (method, gradient checkpointing) cell runs the method's benchmark script
(`bench_memory_sft`, `bench_dpo`, `bench_grpo`, `bench_ppo`) once per framework, one process at
a time (the largest run needs ~10 GB: `--min-free-gb` waits for that much available memory
before each), with `--batch-size 1` (1 pair for DPO, 1 prompt x `--generations` 2 for GRPO, 1
prompt for PPO with `--ppo-epochs` 1 optimizer step per rollout: more repeat the same work),
`--prompt-length 256 --completion-length 1024`, `--warmup 1 --steps 1` (from the second step on
the optimizer states exist), `--no-bare`, float32 on CPU.
The memory is `StepPeaks`' (benchmarks/common.py): the larger resident-memory high-water mark of
the two training steps, each reset just before its step, so model loading does not count.

The by-phase split of our step peak (`phases`): weights, gradients and AdamW's two moments of the
trained model (4, 4 and 8 bytes per parameter, float32), the frozen models a step holds
(DPO/GRPO/PPO: the reference, 4 bytes per parameter; PPO: the reward model too, and the value
model trained like the policy), the process's runtime (Python, torch and the libraries:
`RUNTIME_MB`, the whole step peak of the tiny model), the log-prob working set of the chunked
path (one chunk of logits and one output-layer gradient buffer, `logprob_working_set_mb`),
with gradient checkpointing the layer inputs it keeps (layers x rows x tokens x hidden x 4
bytes), and without it the activations, measured as the difference between the cell's peak and
the same method's peak with checkpointing (plus the layer inputs that one keeps): what
checkpointing removes. What is left (`other`) is temporaries and allocator slack. For scale
each cell gives the size of one dense float32 logits tensor at the shape (rows x T x vocabulary),
which TRL without Liger materialises (3-4 such tensors live at once around its loss).

`--optimizer-in-backward` runs ours with the modules' `optimizer_in_backward` (each parameter
stepped by AdamW as its gradient completes, that gradient freed): the `grads` phase is then the
largest parameter's gradient, the most held at once. It cannot clip gradients: GRPO then runs
without clipping on both sides (`--max-grad-norm 0`), PPO without on ours (TRL's PPO loop never
clips). It is recorded in the JSON.

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
RUNTIME_MB = 550.0  # the whole training-step peak of the tiny model: Python, torch, transformers, Lightning
CHUNK = 256  # the modules' default `logprob_chunk_size`


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
        if method == "ppo":
            cmd += ["--ppo-epochs", str(args.ppo_epochs)]
        if framework == "ours" and args.optimizer_in_backward:
            cmd.append("--optimizer-in-backward")
        if framework == "ours" and args.release_host_memory:
            cmd += ["--release-host-memory", args.release_host_memory]
        if method == "grpo" and args.optimizer_in_backward:  # it cannot clip: neither side clips then
            cmd += ["--max-grad-norm", "0"]
        print(f"[memory] {method} gc={gc} {framework}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            return {"error": f"exit {proc.returncode}: {proc.stderr[-3000:]}"}
        return json.loads(out.read_text())["frameworks"][framework]


def model_sizes(model: str) -> dict[str, int]:
    """Parameters, vocabulary, hidden size and decoder layers of the model (the policy)."""
    from lit_rlhf import models

    tokenizer = models.load_tokenizer(model)
    lm = models.load_causal_lm(model, tokenizer, "float32")
    config = lm.config
    return {"parameters": sum(p.numel() for p in lm.parameters()),
            "largest_parameter": max(p.numel() for p in lm.parameters()), "vocab": config.vocab_size,
            "hidden": config.hidden_size, "layers": config.num_hidden_layers}


def logprob_working_set_mb(vocab: int, hidden: int, chunk: int = CHUNK) -> float:
    """The chunked log-prob path's largest transient (MiB): in its backward pass one chunk's
    logits, turned into the softmax gradient in place (chunk x vocab floats), and the output
    layer's gradient buffer (vocab x hidden floats) it accumulates before handing it to autograd."""
    return (chunk * vocab + vocab * hidden) * 4 / MiB


def checkpoint_inputs_mb(layers: int, rows: int, seq: int, hidden: int) -> float:
    """What non-reentrant checkpointing keeps per decoder layer: its input hidden states (MiB)."""
    return layers * rows * seq * hidden * 4 / MiB


def phases(method: str, params: int, peak_mb: float, *, logprob_mb: float = 0.0, checkpoint_mb: float | None = None,
           activations_mb: float | None = None, grads_mb: float | None = None) -> dict[str, float]:
    """By-phase split (MiB) of our step peak (see the module docstring): the model states by
    arithmetic, the runtime and log-prob working set as given, `checkpoint_mb` (with gradient
    checkpointing) or `activations_mb` (without: measured by difference) when known; `other` is
    the rest of the peak. `grads_mb`: the gradients held at once when that is not all of them
    (with `optimizer_in_backward`, one parameter's at most)."""
    w = 4 * params / MiB
    out = {"weights": w, "grads": w if grads_mb is None else grads_mb, "adam": 2 * w}
    if method in ("dpo", "grpo", "ppo"):
        out["reference"] = w
    if method == "ppo":  # value model (trained, from the reward model) and the frozen reward model
        # with optimizer_in_backward its gradients are in `grads` (one parameter's at a time)
        out["value_weights_grads_adam"] = 4 * w if grads_mb is None else 3 * w
        out["reward_model"] = w
    out["runtime"] = RUNTIME_MB
    if logprob_mb:
        out["logprob_chunks"] = logprob_mb
    if checkpoint_mb is not None:
        out["checkpointed_layer_inputs"] = checkpoint_mb
    if activations_mb is not None:
        out["activations"] = activations_mb
    out["other"] = peak_mb - sum(out.values())
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--methods", default="sft,dpo,grpo,ppo")
    parser.add_argument("--gc", default="off,on", help="gradient checkpointing settings to run: off, on or off,on")
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--completion-length", type=int, default=1024)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--ppo-epochs", type=int, default=1, help="PPO optimizer steps per rollout: each repeats the "
                        "same forward+backward+step, so the peak does not depend on it (from the first step on the AdamW "
                        "moments exist); 1 keeps the run short")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frameworks", default="ours,trl")
    parser.add_argument("--trl-venv", default="/tmp/benchvenv", help="python environment with TRL (SFT, DPO, GRPO)")
    parser.add_argument("--trl-ppo-venv", default="/tmp/benchvenv-ppo", help="python environment with TRL's PPO")
    parser.add_argument("--min-free-gb", type=float, default=12.0)
    parser.add_argument("--optimizer-in-backward", action="store_true", help="ours with optimizer_in_backward: each "
                        "parameter stepped as its gradient completes, so at most one gradient is held")
    parser.add_argument("--release-host-memory", choices=("phases", "layers"), help="ours with this "
                        "release_host_memory: the heap a step frees goes back to the system (glibc's malloc_trim)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--reuse", default=None, help="an earlier --json of the same model and shape: its runs are "
                        "taken as they are instead of run again (give --frameworks/--methods/--gc to choose what runs)")
    parser.add_argument("--reuse-frameworks", default="ours,trl", help="which frameworks' runs --reuse takes")
    parser.add_argument("--markdown", default=None, help="print the tables of this earlier --json as Markdown and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return {}
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.trl_python = {m: str(Path(args.trl_ppo_venv if m == "ppo" else args.trl_venv) / "bin" / "python") for m in SCRIPTS}
    sizes = model_sizes(args.model)
    seq = args.prompt_length + args.completion_length
    result: dict = {"model": args.model, **sizes, "prompt_length": args.prompt_length,
                    "completion_length": args.completion_length, "optimizer_in_backward": args.optimizer_in_backward,
                    "release_host_memory": args.release_host_memory, "load_average_before": os.getloadavg(), "cells": []}
    reused = reusable_runs(args.reuse, result, args.reuse_frameworks.split(",")) if args.reuse else {}
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for method in methods:
        rows = {"sft": 1, "dpo": 2, "grpo": args.generations, "ppo": 1}[method]
        cells = {}
        for gc in [s.strip() == "on" for s in args.gc.split(",") if s.strip()]:
            cell = cells[gc] = {"method": method, "gradient_checkpointing": gc, "rows": rows,
                                "dense_logits_mb": rows * seq * sizes["vocab"] * 4 / MiB}
            for fw in frameworks:
                if (method, gc, fw) in reused:
                    cell[fw] = {**reused[(method, gc, fw)], "reused_from": args.reuse}
                    print(f"[memory] {method} gc={gc} {fw}: reused from {args.reuse}", file=sys.stderr, flush=True)
                else:
                    cell[fw] = run_cell(method, gc, args, fw)
            ours, trl = cell.get("ours", {}), cell.get("trl", {})
            if "peak_rss_mb" in ours and "peak_rss_mb" in trl:
                cell["ours_over_trl"] = ours["peak_rss_mb"] / trl["peak_rss_mb"]
                cell["goal"] = GOALS[gc]
                cell["goal_met"] = cell["ours_over_trl"] <= GOALS[gc]
            add_phases(cells, method, sizes, rows, seq, args.optimizer_in_backward)
            result["cells"].append(cell)
            print(format_cell(cell), flush=True)
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(result, indent=2, default=float))
        if False in cells:
            print(format_cell(cells[False]), flush=True)  # its activations are known once both settings ran
    result["load_average_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=float))
    return result


def add_phases(cells: dict[bool, dict], method: str, sizes: dict[str, int], rows: int, seq: int,
               in_backward: bool = False) -> None:
    """Our by-phase split in each cell of one method (`phases`); the activations of the cell
    without checkpointing once the cell with it has run too. Also, per framework, what
    checkpointing saved (`checkpointing_saved_mb`, in the cell without it)."""
    logprob = logprob_working_set_mb(sizes["vocab"], sizes["hidden"])
    kept = checkpoint_inputs_mb(sizes["layers"], rows, seq, sizes["hidden"])
    grads = 4 * sizes["largest_parameter"] / MiB if in_backward else None
    on, off = cells.get(True, {}), cells.get(False, {})
    if "peak_rss_mb" in on.get("ours", {}):
        on["phases_mb"] = phases(method, sizes["parameters"], on["ours"]["peak_rss_mb"], logprob_mb=logprob, checkpoint_mb=kept,
                                 grads_mb=grads)
    if "peak_rss_mb" in off.get("ours", {}):
        activations = None
        if "peak_rss_mb" in on.get("ours", {}):
            activations = off["ours"]["peak_rss_mb"] - on["ours"]["peak_rss_mb"] + kept
        off["phases_mb"] = phases(method, sizes["parameters"], off["ours"]["peak_rss_mb"], logprob_mb=logprob,
                                  activations_mb=activations, grads_mb=grads)
    for fw in ("ours", "trl"):
        if "peak_rss_mb" in off.get(fw, {}) and "peak_rss_mb" in on.get(fw, {}):
            off.setdefault("checkpointing_saved_mb", {})[fw] = off[fw]["peak_rss_mb"] - on[fw]["peak_rss_mb"]


def reusable_runs(path: str, result: dict, frameworks: list[str]) -> dict[tuple[str, bool, str], dict]:
    """(method, gradient checkpointing, framework) -> a run of `frameworks` in an earlier
    `--json` at the same model and shape (an entry with an error is not reused)."""
    earlier = json.loads(Path(path).read_text())
    shape = ("model", "prompt_length", "completion_length")
    if any(earlier.get(k) != result[k] for k in shape):
        raise SystemExit(f"--reuse {path}: measured at {[earlier.get(k) for k in shape]}, not {[result[k] for k in shape]}")
    for option in ("optimizer_in_backward", "release_host_memory"):
        if "ours" in frameworks and (earlier.get(option) or None) != (result.get(option) or None):
            raise SystemExit(f"--reuse {path}: its runs of ours differ in --{option.replace('_', '-')}; reuse only "
                             "TRL's (--reuse-frameworks trl)")
    return {(c["method"], c["gradient_checkpointing"], fw): c[fw] for c in earlier["cells"] for fw in frameworks
            if "peak_rss_mb" in c.get(fw, {})}


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


PHASE_COLUMNS = ("weights", "grads", "adam", "reference", "value_weights_grads_adam", "reward_model", "runtime",
                 "logprob_chunks", "checkpointed_layer_inputs", "activations", "other")


def markdown(result: dict) -> str:
    """The peaks table and our by-phase table of a `--json` result, as Markdown (for RESULTS.md)."""
    lines = ["| method | gradient checkpointing | ours MiB | TRL MiB | ours / TRL | goal | dense logits MiB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]

    def mib(entry: dict) -> str:
        return f"{entry['peak_rss_mb']:.0f}" if "peak_rss_mb" in entry else ("error" if "error" in entry else "-")

    for c in result["cells"]:
        ratio = f"{c['ours_over_trl']:.2f}x" if "ours_over_trl" in c else "-"
        goal = f"<= {c['goal']}x: {'met' if c['goal_met'] else 'missed'}" if "goal" in c else "-"
        lines.append(f"| {c['method'].upper()} | {'on' if c['gradient_checkpointing'] else 'off'} | {mib(c.get('ours', {}))} | "
                     f"{mib(c.get('trl', {}))} | {ratio} | {goal} | {c['dense_logits_mb']:.0f} |")
    cells = [c for c in result["cells"] if "phases_mb" in c]
    used = [k for k in PHASE_COLUMNS if any(k in c["phases_mb"] for c in cells)]
    lines += ["", "| ours, MiB | " + " | ".join(used) + " | peak |", "| --- " * (len(used) + 2) + "|"]
    for c in cells:
        ph = c["phases_mb"]
        lines.append(f"| {c['method'].upper()} GC {'on' if c['gradient_checkpointing'] else 'off'} | "
                     + " | ".join(f"{ph[k]:.0f}" if k in ph else "" for k in used) + f" | {c['ours']['peak_rss_mb']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
