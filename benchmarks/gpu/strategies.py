"""SFT under each shipped strategy overlay on one GPU: step time, MFU, peak memory.

    python -m benchmarks.gpu.run --methods sft --frameworks ours --strategies none,deepspeed_zero2,deepspeed_zero3,fsdp2 --out F

Each strategy runs in its own process (DeepSpeed and FSDP2 set up a process group and keep state
in the process): `SFTModule` (`benchmarks.bench_memory_sft`'s workload and batches) fitted by a
Lightning Trainer on one GPU, bf16-mixed, with the strategy that `configs/strategy/<name>.yaml`
builds (its `trainer.strategy` class and arguments, so the numbers are the overlay's as users get
it); `none` is Lightning's single-device strategy. On one GPU the sharded strategies shard
nothing: the comparison shows what each costs in time and memory before it pays off on several.
DeepSpeed under bf16-mixed keeps bf16 weights with float32 master copies in its optimizer;
Lightning's own bf16-mixed keeps float32 weights and autocasts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks import common
from benchmarks.gpu import flops as F

STRATEGY_DIR = common.REPO / "configs" / "strategy"


def strategy_from_overlay(name: str):
    """The strategy object `configs/strategy/<name>.yaml` configures (`none`: Lightning's default)."""
    if name == "none":
        return "auto"
    path = STRATEGY_DIR / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no strategy overlay {path} (have: {', '.join(sorted(p.stem for p in STRATEGY_DIR.glob('*.yaml')))})")
    spec = yaml.safe_load(path.read_text())["trainer"]["strategy"]
    if isinstance(spec, str):
        return spec
    module_name, _, class_name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)(**spec.get("init_args", {}))


def run_in_subprocess(name: str, model_dir: Path, args: argparse.Namespace, peak: float | None) -> dict[str, Any]:
    """Run one strategy's worker in a fresh process; its record, or an error record."""
    with tempfile.TemporaryDirectory(prefix="lit_rlhf_strategy_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "benchmarks.gpu.strategies", "--strategy", name, "--model", str(model_dir),
               "--prompt-length", str(args.prompt_length), "--completion-length", str(args.completion_length),
               "--out", str(out)] + (["--dry-run"] if args.dry_run else [])
        proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            return {"strategy": name, "status": "error", "error": f"exit {proc.returncode}: {proc.stderr[-3000:]}"}
        record = json.loads(out.read_text())
    shape = F.ModelShape(**record.pop("shape"))
    work = F.step_flops("sft", shape, batch=record["batch_size"], prompt=args.prompt_length, completion=args.completion_length)
    record.update(model_flops=work, mfu=F.mfu(work["total"], record["step_s"]["median"], peak))
    return record


def worker(ns: argparse.Namespace) -> dict[str, Any]:
    from lightning import Trainer
    from torch.utils.data import DataLoader

    from benchmarks.bench_memory_sft import LR, sft_batch
    from lit_rlhf.modules import SFTModule

    gpu = torch.cuda.is_available() and not ns.dry_run
    cfg = common.BenchConfig(model=ns.model, batch_size=2 if ns.dry_run else 8, prompt_length=ns.prompt_length,
                             completion_length=ns.completion_length, warmup=1 if ns.dry_run else 2, steps=1 if ns.dry_run else 5)
    common.setup_worker(cfg)
    started = time.perf_counter()
    module = SFTModule(model=cfg.model, lr=LR, lr_scheduler="cosine")
    built = time.perf_counter()
    batches = [sft_batch(rows) for rows in common.step_rows(cfg, module.tokenizer)]
    timer = common.StepTimer()
    trainer = Trainer(accelerator="gpu" if gpu else "cpu", devices=1, precision="bf16-mixed" if gpu else "32-true",
                      strategy=strategy_from_overlay(ns.strategy), max_steps=len(batches), logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, callbacks=[timer])
    loader = DataLoader(batches, batch_size=None, shuffle=False, collate_fn=lambda item: item)
    trainer.fit(module, train_dataloaders=loader)
    steps = timer.times[cfg.warmup:]
    shape = F.ModelShape.from_config(module.policy.config)
    median = statistics.median(steps)
    tokens = float(batches[0].attention_mask.sum())
    return {"strategy": ns.strategy, "status": "ok", "strategy_class": type(trainer.strategy).__name__,
            "step_s": {"median": median, "min": min(steps), "max": max(steps), "n": len(steps)},
            "tokens_per_s": tokens / median, "batch_size": cfg.batch_size, "shape": shape.to_dict(),
            # set-up: the module's construction (model loading), then fit's start to the first step
            "module_init_s": built - started, "fit_setup_s": timer.first_started - built if timer.first_started else None,
            "peak_gpu_mib": round(max(common.StepPeaks.cuda_peaks), 1) if common.StepPeaks.cuda_peaks else None}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="one strategy's SFT worker (run by benchmarks.gpu.run --strategies)")
    p.add_argument("--strategy", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-length", type=int, default=512)
    p.add_argument("--completion-length", type=int, default=256)
    p.add_argument("--out", required=True)
    p.add_argument("--dry-run", action="store_true")
    ns = p.parse_args(argv)
    Path(ns.out).write_text(json.dumps(worker(ns)))


if __name__ == "__main__":
    main()
