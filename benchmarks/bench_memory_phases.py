"""Where our training step's memory goes, measured by torch's own allocator accounting.

    python -m benchmarks.bench_memory_phases --model smollm2-135m-instruct --method sft --gradient-checkpointing

Fits our module (SFT: `SFTModule` on one prompt+completion row; DPO: `DPOModule` on one pair) for
`--warmup` + 1 steps at `--prompt-length` + `--completion-length` tokens, and profiles the last
step with `torch.profiler` (`profile_memory`, `record_shapes`, `with_stack`). torch's memory
profiler (`torch.profiler._memory_profiler`, the data behind `export_memory_timeline`) follows
every CPU tensor allocation of the step and files it under parameter, optimizer state, gradient,
activation, temporary, autograd detail, input or unknown. The report gives the bytes of each
category at the moment the step's live tensor bytes peak, and each category's own peak.

This counts tensors only: the process's resident memory (`bench_memory`'s figure) adds the
runtime (Python, the libraries), the allocator's slack (freed memory it keeps), and whatever
was allocated before the profiled step and never freed (it is counted, as pre-existing).
A private torch API: its categories are heuristics (a tensor it cannot place is `unknown`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

MiB = 1024 * 1024


def category_peaks(profile: Any) -> dict[str, Any]:
    """From a finished `torch.profiler.profile`: the live CPU tensor bytes by category (MiB) at
    the step's peak, each category's own peak, and the total peak."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    timeline = MemoryProfileTimeline(profile._memory_profile())
    _, sizes = timeline._coalesce_timeline("cpu")  # per time: [unused, one per category]
    names = ["unknown" if c is None else c.name.lower() for c in _CATEGORY_TO_INDEX]
    if not sizes:
        return {"peak_mb": 0.0, "at_peak_mb": {}, "category_peaks_mb": {}}
    totals = [sum(row[1:]) for row in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    return {
        "peak_mb": totals[at] / MiB,
        "at_peak_mb": {n: sizes[at][i + 1] / MiB for n, i in zip(names, _CATEGORY_TO_INDEX.values())},
        "category_peaks_mb": {n: max(row[i + 1] for row in sizes) / MiB for n, i in zip(names, _CATEGORY_TO_INDEX.values())},
    }


def build(method: str, model: str, gradient_checkpointing: bool, prompt_length: int, completion_length: int, steps: int,
          optimizer_in_backward: bool = False):
    """Our module and one batch per step (the same data as `bench_memory_sft` / `bench_dpo`)."""
    from benchmarks.bench_memory_sft import sft_batch
    from benchmarks.common import preference_batch, token_rows

    if method == "sft":
        from lit_rlhf.modules import SFTModule

        module = SFTModule(model=model, lr=1e-5, lr_scheduler="cosine", gradient_checkpointing=gradient_checkpointing,
                           optimizer_in_backward=optimizer_in_backward)
        rows = token_rows(module.tokenizer, steps, prompt_length, completion_length)
        return module, [sft_batch([row]) for row in rows]
    if method == "dpo":
        from lit_rlhf.modules import DPOModule

        module = DPOModule(model=model, beta=0.1, lr=1e-5, lr_scheduler="cosine", gradient_checkpointing=gradient_checkpointing,
                           optimizer_in_backward=optimizer_in_backward)
        rows = token_rows(module.tokenizer, steps, prompt_length, completion_length)
        return module, [preference_batch([row]) for row in rows]
    raise SystemExit(f"--method must be sft or dpo, got {method!r}")


def profile_last_step(module, batches: list, threads: int) -> dict[str, Any]:
    """Fit `module` on `batches` (one per step) and profile the last step."""
    from lightning import Callback, Trainer
    from torch.utils.data import DataLoader

    from benchmarks.common import StepPeaks

    class ProfileLast(Callback):
        def __init__(self) -> None:
            self.profiler = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            StepPeaks.start()
            if batch_idx == len(batches) - 1:
                self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                                       record_shapes=True, with_stack=True)
                self.profiler.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if self.profiler is not None and batch_idx == len(batches) - 1:
                self.profiler.__exit__(None, None, None)
            StepPeaks.stop()

    torch.set_num_threads(threads)
    callback = ProfileLast()
    trainer = Trainer(accelerator="cpu", devices=1, precision="32-true", max_steps=len(batches), logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, callbacks=[callback])
    trainer.fit(module, train_dataloaders=DataLoader(list(batches), batch_size=None, collate_fn=lambda item: item))
    out = category_peaks(callback.profiler)
    out["step_rss_peaks_mb"] = list(StepPeaks.peaks)  # the last one under the profiler (its buffers included)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--method", default="sft", choices=("sft", "dpo"))
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--optimizer-in-backward", action="store_true", help="the module's optimizer_in_backward")
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--completion-length", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=1, help="unprofiled steps first (the AdamW moments exist from the second step on)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    module, batches = build(args.method, args.model, args.gradient_checkpointing, args.prompt_length,
                            args.completion_length, args.warmup + 1, args.optimizer_in_backward)
    result = {"config": vars(args), **profile_last_step(module, batches, args.threads)}
    print(f"{args.method} gc={'on' if args.gradient_checkpointing else 'off'}: live tensor peak {result['peak_mb']:.0f} MiB = "
          + ", ".join(f"{k} {v:.0f}" for k, v in result["at_peak_mb"].items() if v) + " | each category's own peak: "
          + ", ".join(f"{k} {v:.0f}" for k, v in result["category_peaks_mb"].items() if v), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
