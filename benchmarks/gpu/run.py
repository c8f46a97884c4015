"""The GPU benchmark: step time, tokens/s, MFU, peak memory and the step's phases, ours beside TRL.

    python -m benchmarks.gpu.run --out benchmarks/results/gpu/$(date +%F)-gpu.json
    python -m benchmarks.gpu.run --dry-run --out /tmp/gpu_dry.json     # CPU, tiny shapes, seconds

For each model size (random weights from a published config: SmolLM2-360M and SmolLM2-1.7B,
Llama shape, the embedded SmolLM2 tokenizer; random weights time exactly like trained ones) and
each method (SFT, DPO, GRPO with transformers generation, PPO), the method benchmarks' own
workers (`benchmarks/bench_*.py`: the same model, token ids, batch, lengths and learning settings
on both sides) run on one GPU under bf16-mixed (float32 weights, bf16 autocast: Lightning's
`bf16-mixed`, TRL's `bf16=True`), ours then TRL's where TRL has the trainer (TRL 1.13+ has no
PPOTrainer: PPO is ours alone). Real lengths: prompt 512 tokens, completion 256.

Per case it records the step time (median of the measured steps after warm-up, the GPU
synchronised at each step's ends), tokens and completions per second, the peak allocated GPU
memory of a step, the time in generation, in the forward-only log-prob passes and in the update,
the model FLOPs of the step (`benchmarks.gpu.flops`) and the MFU against the GPU's datasheet peak
(and the measured bf16 matmul rate, for scale). Cases run in one process, one after the other
(the GPU's peak-memory counter is reset per step; every case's objects are freed before the
next); the result file is rewritten after every case, so a run cut short keeps what it measured.
`--budget-s` skips the cases that would start after it (marked `skipped`).

`--strategies` adds the strategy comparison (`benchmarks.gpu.strategies`): SFT on the largest
size under each shipped strategy overlay (configs/strategy/*.yaml), one process each.
Render the result into benchmarks/RESULTS.md with `python -m benchmarks.gpu.report FILE --write`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.gpu import flops as F
from benchmarks.gpu import report

METHODS = ("sft", "dpo", "grpo", "ppo")
# workload per method at real lengths (prompt 512, completion 256), sized for one 80 GB GPU
# without gradient checkpointing at 1.7B parameters
WORKLOADS: dict[str, dict[str, Any]] = {
    "sft": dict(batch_size=8, warmup=2, steps=5),
    "dpo": dict(batch_size=4, warmup=2, steps=5),
    "grpo": dict(batch_size=4, warmup=1, steps=2, extra=dict(generations=4)),
    # PPO trains two models (policy and value) beside two frozen ones: 4 prompts fit 1.7B on 80 GB
    "ppo": dict(batch_size=4, warmup=1, steps=2, extra=dict(ppo_epochs=4)),
}
WORKER_MODULES = {"sft": "benchmarks.bench_memory_sft", "dpo": "benchmarks.bench_dpo", "grpo": "benchmarks.bench_grpo",
                  "ppo": "benchmarks.bench_ppo"}
EXTRA_DEFAULTS = {"optimizer_in_backward": False, "max_grad_norm": 1.0}


def _workers(method: str):
    """(ours, trl or None) of a method's benchmark script."""
    import importlib

    module = importlib.import_module(WORKER_MODULES[method])
    trl = getattr(module, "trl", None)
    if method == "ppo" and not module.trl_has_ppo():
        trl = None  # TRL 1.13+ has no PPOTrainer
    return module.ours, trl


def build_model(shape: F.ModelShape, tokenizer, out_dir: Path, device: str, seed: int) -> Path:
    """Random weights of `shape` (initialised as transformers does for a new model), saved with the
    tokenizer as a model directory both frameworks load."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(**shape.llama_config(), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del model
    _free()
    return out_dir


def on_gpu(args: argparse.Namespace) -> bool:
    """Whether this run measures on the GPU (a dry run stays on the CPU)."""
    return torch.cuda.is_available() and not args.dry_run


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gpu_info() -> dict[str, Any]:
    """The GPU, its datasheet bf16 peak and a measured bf16 matmul rate (8192^3, median of 10)."""
    if not torch.cuda.is_available():
        return {"name": "cpu (dry run)", "peak_bf16_flops": None}
    props = torch.cuda.get_device_properties(0)
    info: dict[str, Any] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                            "multiprocessors": props.multi_processor_count, "cuda": torch.version.cuda,
                            "peak_bf16_flops": F.peak_bf16_flops(props.name)}
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    info["measured_bf16_matmul_flops"] = 2 * 8192**3 / statistics.median(times)
    del a, b
    _free()
    return info


def versions() -> dict[str, str]:
    import lightning
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "lightning": lightning.__version__}
    if common.trl_available():
        import trl

        out["trl"] = trl.__version__
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(result: common.WorkerResult, method: str, shape: F.ModelShape, cfg: common.BenchConfig,
            peak: float | None) -> dict[str, Any]:
    """One case's record: times, throughput, memory, phases, model FLOPs and MFU."""
    step = statistics.median(result.step_times)
    generations = cfg.extra.get("generations", 1)
    completion = float(result.info.get("mean_completion_length") or cfg.completion_length)
    if method == "ppo":
        completion = float(cfg.completion_length)  # sampled to max_new_tokens at most; EOS is rare with random weights
    work = F.step_flops(method, shape, batch=cfg.batch_size, prompt=cfg.prompt_length, completion=completion,
                        generations=generations, ppo_epochs=cfg.extra.get("ppo_epochs", 1))
    generation = _median(result.generation_times)
    rollout = _median(result.rollout_times)
    update = _median(result.update_times) if result.update_times else (None if rollout is not None else step)
    record: dict[str, Any] = {
        "step_s": {"median": step, "min": min(result.step_times), "max": max(result.step_times), "n": len(result.step_times)},
        "optimizer_steps_per_step": result.optimizer_steps_per_step,
        "tokens_per_step": result.tokens_per_step,
        "tokens_per_s": result.tokens_per_step / step,
        "completions_per_s": result.completions_per_step / step if result.completions_per_step else None,
        "mean_completion_length": completion if method in ("grpo", "ppo") else None,
        "peak_gpu_mib": result.info.get("cuda_step_peak_mb"),
        "phases_s": {"generation": generation, "logprob_passes": (rollout - generation) if rollout is not None and generation is not None else None,
                     "update": update},
        "model_flops": work,
        "mfu": F.mfu(work["total"], step, peak),
        "update_mfu": F.mfu(work["update"], update, peak) if update else None,
        "info": {k: v for k, v in result.info.items() if k not in ("step_peaks_mb",)},
    }
    record["phase_share"] = {k: (v / step if v is not None else None) for k, v in record["phases_s"].items()}
    return record


def run_case(method: str, framework: str, worker, shape: F.ModelShape, model_dir: Path, args: argparse.Namespace,
             peak: float | None, case_key: str = "") -> dict[str, Any]:
    spec = WORKLOADS[method]
    extra = dict(EXTRA_DEFAULTS, **spec.get("extra", {}))
    cfg = common.BenchConfig(
        model=str(model_dir), batch_size=spec["batch_size"] if not args.dry_run else 2,
        prompt_length=args.prompt_length, completion_length=args.completion_length,
        warmup=spec["warmup"] if not args.dry_run else 1, steps=spec["steps"] if not args.dry_run else 1,
        rounds=1, frameworks=framework, threads=args.threads, seed=args.seed, in_process=True, no_bare=True,
        profile=bool(case_key) and case_key in {c.strip() for c in args.profile.split(",")},
        accelerator="gpu" if on_gpu(args) else "cpu", precision="bf16-mixed" if on_gpu(args) else "32-true", extra=extra,
    )
    held = torch.cuda.memory_allocated() / 2**20 if torch.cuda.is_available() else None  # left by earlier cases
    started = time.perf_counter()
    result = common._run_worker(WORKER_MODULES[method], worker, cfg, [], framework)
    record = measure(result, method, shape, cfg, peak)
    if result.profile:
        record["profile"] = result.profile[:20000]
    record.update(case_seconds=time.perf_counter() - started, gpu_mib_held_before=held, batch_size=cfg.batch_size, warmup=cfg.warmup,
                  prompt_length=cfg.prompt_length, completion_length=cfg.completion_length, extra=extra)
    return record


def measure_case(method: str, framework: str, worker, shape: F.ModelShape, model_dir: Path,
                 args: argparse.Namespace, peak: float | None, key: str, elapsed: float,
                 trl_version: str | None) -> dict[str, Any]:
    """One case's status and record: not run (no such TRL trainer), skipped (past `--budget-s`),
    measured, or its error (one failed case must not lose the others)."""
    if worker is None or (framework == common.TRL_TOKEN and not common.trl_available()):
        reason = "TRL is not importable" if not common.trl_available() else f"TRL {trl_version} has no {method.upper()} trainer"
        return {"status": "not run", "reason": reason}
    if args.budget_s and elapsed > args.budget_s:
        return {"status": "skipped", "reason": f"time budget of {args.budget_s:.0f} s spent"}
    print(f"[gpu-bench] {key.replace('/', ' ')} ...", file=sys.stderr, flush=True)
    try:
        return {"status": "ok", **run_case(method, framework, worker, shape, model_dir, args, peak, key)}
    except Exception as error:  # noqa: BLE001 - one failed case must not lose the others
        return {"status": "error", "error": f"{type(error).__name__}: {error}"[-2000:],
                "traceback": traceback.format_exc()[-4000:]}
    finally:
        _free()


def measure_strategy(name: str, size: str, shape: F.ModelShape, model_dir: Path, args: argparse.Namespace,
                     peak: float | None, elapsed: float) -> dict[str, Any]:
    """One strategy overlay's SFT record (`benchmarks.gpu.strategies`, its own process), or skipped."""
    from benchmarks.gpu import strategies

    if args.budget_s and elapsed > args.budget_s:
        record = {"strategy": name, "status": "skipped", "reason": f"time budget of {args.budget_s:.0f} s spent"}
    else:
        print(f"[gpu-bench] strategy {name} (sft, {size}) ...", file=sys.stderr, flush=True)
        record = strategies.run_in_subprocess(name, model_dir, args, peak)
    return dict(record, size=size, parameters=shape.parameters())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", default="smollm2-360m,smollm2-1.7b", help=f"model shapes: {', '.join(F.SHAPES)}")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--frameworks", default="ours,trl", help="ours and/or trl (TRL where importable and it has the trainer)")
    p.add_argument("--tokenizer", default="smollm2-135m-instruct", help="a lit_rlhf model name or a tokenizer directory")
    p.add_argument("--prompt-length", type=int, default=512)
    p.add_argument("--completion-length", type=int, default=256)
    p.add_argument("--threads", type=int, default=8, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=0.0, help="skip cases that would start after this many seconds (0: none)")
    p.add_argument("--only", default="", help="comma list of size/method/framework cases to run (e.g. "
                   "smollm2-360m/grpo/trl); empty: every case of --sizes x --methods x --frameworks")
    p.add_argument("--strategies", default="", help="comma list of configs/strategy overlays to compare on SFT "
                   "(e.g. none,deepspeed_zero2,deepspeed_zero3,fsdp2); empty: no comparison")
    p.add_argument("--strategy-size", default=None, help="the size the strategies train (default: the last of --sizes)")
    p.add_argument("--profile", default="", help="comma list of size/method/framework cases to run under cProfile "
                   "(the top functions by cumulative time go into the case's record)")
    p.add_argument("--commit", default=None, help="the commit to record (default: `git rev-parse` of the tree)")
    p.add_argument("--out", required=True, help="the result file (JSON), rewritten after every case")
    p.add_argument("--dry-run", action="store_true", help="CPU, the tiny shape, 16+8 tokens, 1 measured step: checks the script")
    args = p.parse_args(argv)
    if args.dry_run:
        args.sizes, args.prompt_length, args.completion_length = "tiny", 16, 8
        if args.tokenizer == "smollm2-135m-instruct":
            args.tokenizer = "tiny-random-llama"
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from lit_rlhf import models

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    clock = time.perf_counter()
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    gpu = gpu_info()
    peak = gpu["peak_bf16_flops"]
    doc: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "gpu": gpu, "versions": versions(),
        "commit": args.commit or _commit(), "host": {"cpu_count": os.cpu_count(), "load_average_before": os.getloadavg()},
        "precision": "bf16-mixed (float32 weights, bf16 autocast)" if on_gpu(args) else "32-true",
        "dry_run": args.dry_run, "flops_counting": "benchmarks/gpu/flops.py (6N per trained token + attention, PaLM App. B)",
        "cases": [], "strategies": [],
    }

    def save() -> None:
        doc["host"]["load_average_after"] = os.getloadavg()
        doc["elapsed_s"] = time.perf_counter() - clock
        out_path.write_text(json.dumps(doc, indent=2))

    tokenizer = models.load_tokenizer(args.tokenizer)
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    only = {c.strip() for c in args.only.split(",") if c.strip()}
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    device = "cuda" if on_gpu(args) else "cpu"
    built: dict[str, tuple[F.ModelShape, Path]] = {}
    with tempfile.TemporaryDirectory(prefix="lit_rlhf_gpu_bench_") as tmp:

        def model_of(size: str) -> tuple[F.ModelShape, Path]:
            if size not in built:
                shape = dataclasses.replace(F.SHAPES[size], vocab=len(tokenizer))  # no embedding resize at load (D3 adds PAD)
                built[size] = (shape, build_model(shape, tokenizer, Path(tmp) / size, device, args.seed))
            return built[size]

        for size in sizes:
            for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
                ours, trl = _workers(method)
                for framework in frameworks:
                    if only and f"{size}/{method}/{framework}" not in only:
                        continue
                    shape, model_dir = model_of(size)
                    case = {"size": size, "parameters": shape.parameters(), "shape": shape.to_dict(), "method": method,
                            "framework": framework}
                    worker = ours if framework == common.OURS else trl
                    case.update(measure_case(method, framework, worker, shape, model_dir, args, peak,
                                             f"{size}/{method}/{framework}", time.perf_counter() - clock,
                                             doc["versions"].get("trl")))
                    doc["cases"].append(case)
                    print(report.case_line(case), flush=True)
                    save()
        if args.strategies:
            size = args.strategy_size or sizes[-1]
            shape, model_dir = model_of(size)
            for name in [s.strip() for s in args.strategies.split(",") if s.strip()]:
                record = measure_strategy(name, size, shape, model_dir, args, peak, time.perf_counter() - clock)
                doc["strategies"].append(record)
                print(report.strategy_line(record), flush=True)
                save()
    save()
    return doc


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=common.REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    main()
