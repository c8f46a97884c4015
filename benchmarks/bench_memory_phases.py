"""Where our training step's memory goes: the live blocks at the step's peak, torch's categories,
and the allocator's share of the resident peak.

    python -m benchmarks.bench_memory_phases --model smollm2-135m-instruct --method dpo --gradient-checkpointing --no-categories
    python -m benchmarks.bench_memory_phases --model smollm2-135m-instruct --method dpo --gradient-checkpointing --malloc

Fits our module (SFT: `SFTModule` on one prompt+completion row; DPO: `DPOModule` on one pair) for
`--warmup` + 1 steps at `--prompt-length` + `--completion-length` tokens and analyses the last
step, one of two ways:

- profiled (default): `torch.profiler` with `profile_memory` and `with_stack`. `peak_allocations`
  replays the profiler's raw CPU allocation events, starting from the blocks that exist before
  the step (weights, gradients, AdamW moments: `known_blocks`), finds the moment the live bytes
  peak and lists what is live there, grouped by the op and Python frames that allocated it (or
  the kind of known block), with the phase (forward, backward, optimizer) the peak sits in. Unless
  `--no-categories`, torch's memory profiler (`torch.profiler._memory_profiler`, the data behind
  `export_memory_timeline`; private API, heuristic categories) also files every tensor under
  parameter, optimizer state, gradient, activation, temporary, autograd detail, input or unknown
  (its analysis holds several GiB at the long shape).
- `--malloc`: no profiler; a thread samples the resident memory and glibc's `mallinfo2` every
  5 ms through the step (`MallocSampler`), which splits the resident peak into heap blocks in
  use, free heap memory glibc keeps, separately mapped blocks and the rest (code, Python).

The profiled analyses count tensors only: the process's resident memory (`bench_memory`'s figure)
adds the runtime (Python, the libraries) and the allocator's slack (freed memory it keeps).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from lit_rlhf.training.memory import Memory

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


def _frames(node: Any) -> list[str]:
    """The op and Python-frame names from an allocation event up to the root, innermost first."""
    names = []
    node = node.parent
    while node is not None:
        names.append(node.name)
        node = node.parent
    return names


def _phase(names: list[str]) -> str:
    """backward (inside the autograd engine), forward (inside Lightning's closure that runs
    `training_step`) or optimizer (inside an optimizer's step, around the closure), innermost first."""
    for n in names:
        if n.startswith("autograd::engine::evaluate_function"):
            return "backward"
        if "loops/optimization/automatic.py" in n:
            return "forward"
        if "torch/optim/" in n:
            return "optimizer"
    return "other"


def _label(names: list[str]) -> str:
    """Where an allocation comes from: its innermost aten op, the innermost autograd node (in the
    backward pass) and the innermost Python frames of our code, transformers, torch.nn/optim or
    Lightning."""
    op = next((n for n in names if n.startswith("aten::")), "?")
    grad_fn = next((n.split(": ", 1)[-1] for n in names if n.startswith("autograd::engine::evaluate_function")), None)
    frames = [n for n in names if ".py(" in n and any(k in n for k in ("lit_rlhf/", "transformers/", "torch/nn/", "torch/optim/",
                                                                        "torch/utils/checkpoint", "lightning/"))]
    frames = [f.split("site-packages/")[-1] for f in frames[:2]]
    return " < ".join([op] + ([grad_fn] if grad_fn else []) + frames)


def known_blocks(module: Any, optimizers: list) -> dict[int, tuple[int, str]]:
    """The memory blocks that exist before the profiled step, by data pointer: each parameter,
    gradient and optimizer state tensor of `module`'s models and `optimizers` -> (bytes, what)."""
    blocks: dict[int, tuple[int, str]] = {}

    def add(t: Any, what: str) -> None:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel():
            storage = t.untyped_storage()
            blocks.setdefault(storage.data_ptr(), (storage.nbytes(), what))

    for p in module.parameters():
        add(p, "parameter" if p.requires_grad else "frozen parameter")
        add(p.grad, "gradient (earlier step)")
    for b in module.buffers():
        add(b, "buffer")
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for t in state.values():
                add(t, "optimizer state")
    return blocks


def peak_allocations(profile: Any, known: dict[int, tuple[int, str]] | None = None, top: int = 15) -> dict[str, Any]:
    """The CPU memory blocks live at the moment the allocated bytes peak in the profiled step,
    from the profiler's raw allocation events (`profile_memory`) and the `known` blocks that
    existed before it (`known_blocks`; freed ones leave the count when the step frees them):
    where the peak sits (the allocating op's frames and phase), the live bytes grouped by the op
    (or the kind of known block) that made them, and the largest blocks. Blocks made before the
    step and not known (Python objects, the batch) are not counted."""
    from torch._C._profiler import _EventType

    events = []
    stack = list(profile.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
            events.append(node)
    events.sort(key=lambda n: n.start_time_ns)
    known = dict(known or {})
    live: dict[int, tuple[int, Any]] = {ptr: (size, what) for ptr, (size, what) in known.items()}
    total = sum(size for size, _ in live.values())
    peak, peak_index = total, -1
    for i, node in enumerate(events):  # pass 1: where the total peaks
        size, ptr = node.typed[1].alloc_size, node.typed[1].ptr
        if size > 0:
            live[ptr] = (size, node)
            total += size
        elif ptr in live:
            total -= live.pop(ptr)[0]
        if total > peak:
            peak, peak_index = total, i
    live = {ptr: (size, what) for ptr, (size, what) in known.items()}
    for node in events[: peak_index + 1]:  # pass 2: what is live there
        size, ptr = node.typed[1].alloc_size, node.typed[1].ptr
        if size > 0:
            live[ptr] = (size, node)
        else:
            live.pop(ptr, None)
    groups: dict[tuple[str, str], int] = {}
    blocks = []
    for size, node in live.values():
        if isinstance(node, str):
            key = ("before the step", node)
        else:
            names = _frames(node)
            key = (_phase(names), _label(names))
        groups[key] = groups.get(key, 0) + size
        blocks.append((size, key))
    at = _frames(events[peak_index]) if peak_index >= 0 else []
    return {
        "allocated_peak_mb": peak / MiB,
        "peak_at": {"phase": _phase(at), "where": _label(at)},
        "live_by_origin_mb": [{"phase": k[0], "origin": k[1], "mb": v / MiB}
                              for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v >= MiB or k[0] == "before the step"],
        "largest_blocks_mb": [{"phase": k[0], "origin": k[1], "mb": s / MiB} for s, k in sorted(blocks, key=lambda b: -b[0])[:top]],
    }


class MallocSampler:
    """Samples, every `interval` seconds on a thread, the resident memory (`VmRSS`) and glibc's
    heap accounting (`mallinfo2`: `arena` = heap bytes taken from the system, `uordblks` = of those
    in use, `fordblks` = free but kept, `hblkhd` = bytes in blocks mapped on their own), so the
    resident peak can be split into live heap blocks, the allocator's kept free memory and the rest
    (code, libraries, Python). Linux with glibc only."""

    FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")

    def __init__(self, interval: float = 0.005) -> None:
        import ctypes
        import threading

        class Mallinfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in self.FIELDS]

        self._libc = ctypes.CDLL("libc.so.6")
        self._libc.mallinfo2.restype = Mallinfo2
        self.interval = interval
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, float]:
        info = self._libc.mallinfo2()
        rss = 0.0
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024.0
        return {"rss_mb": rss, "heap_mb": info.arena / MiB, "heap_in_use_mb": info.uordblks / MiB,
                "heap_free_kept_mb": info.fordblks / MiB, "mapped_blocks_mb": info.hblkhd / MiB}

    def _run(self) -> None:
        self.samples.append(self.sample())
        while not self._stop.wait(self.interval):
            self.samples.append(self.sample())

    def __enter__(self) -> "MallocSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.sample())

    def at_peak(self) -> dict[str, float]:
        """The sample with the largest resident memory."""
        return max(self.samples, key=lambda s: s["rss_mb"]) if self.samples else {}


def sample_last_step(module, batches: list, threads: int) -> dict[str, Any]:
    """Fit `module` on `batches` without the profiler and sample resident memory and glibc's heap
    (`MallocSampler`) through the last step: where the resident peak's bytes are."""
    from lightning import Callback

    from benchmarks.common import StepPeaks

    class SampleLast(Callback):
        sampler: MallocSampler | None = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            StepPeaks.start()
            if batch_idx == len(batches) - 1:
                self.before = MallocSampler().sample()
                self.sampler = MallocSampler().__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if self.sampler is not None and batch_idx == len(batches) - 1:
                self.sampler.__exit__(None, None, None)
            StepPeaks.stop()

    callback = SampleLast()
    fit_steps(module, batches, threads, callback)
    return {"step_rss_peaks_mb": list(StepPeaks.peaks), "before_last_step": callback.before,
            "at_rss_peak": callback.sampler.at_peak(), "samples": len(callback.sampler.samples)}


def fit_steps(module, batches: list, threads: int, callback) -> None:
    """Fit `module` for one step per batch on CPU in float32, `callback` watching."""
    from lightning import Trainer
    from torch.utils.data import DataLoader

    torch.set_num_threads(threads)
    trainer = Trainer(accelerator="cpu", devices=1, precision="32-true", max_steps=len(batches), logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, callbacks=[callback])
    trainer.fit(module, train_dataloaders=DataLoader(list(batches), batch_size=None, collate_fn=lambda item: item))


def build(method: str, model: str, gradient_checkpointing: bool, prompt_length: int, completion_length: int, steps: int,
          optimizer_in_backward: bool = False, release_host_memory: str | None = None):
    """Our module and one batch per step (the same data as `bench_memory_sft` / `bench_dpo`)."""
    from benchmarks.bench_memory_sft import sft_batch
    from benchmarks.common import preference_batch, token_rows

    if method == "sft":
        from lit_rlhf.modules import SFTModule

        module = SFTModule(model=model, lr=1e-5, lr_scheduler="cosine", memory=Memory(gradient_checkpointing=gradient_checkpointing, optimizer_in_backward=optimizer_in_backward, release_host_memory=release_host_memory))
        rows = token_rows(module.tokenizer, steps, prompt_length, completion_length)
        return module, [sft_batch([row]) for row in rows]
    if method == "dpo":
        from lit_rlhf.modules import DPOModule

        module = DPOModule(model=model, beta=0.1, lr=1e-5, lr_scheduler="cosine", memory=Memory(gradient_checkpointing=gradient_checkpointing, optimizer_in_backward=optimizer_in_backward, release_host_memory=release_host_memory))
        rows = token_rows(module.tokenizer, steps, prompt_length, completion_length)
        return module, [preference_batch([row]) for row in rows]
    raise SystemExit(f"--method must be sft or dpo, got {method!r}")


def profile_last_step(module, batches: list, threads: int, categories: bool = True, top: int = 15) -> dict[str, Any]:
    """Fit `module` on `batches` (one per step) and profile the last step: the live blocks at its
    peak (`peak_allocations`), and torch's categories (`category_peaks`) when `categories`."""
    from lightning import Callback

    from benchmarks.common import StepPeaks

    class ProfileLast(Callback):
        def __init__(self) -> None:
            self.profiler = None
            self.known: dict[int, tuple[int, str]] = {}

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == len(batches) - 2:
                # torch's CPU allocator reports the free of a block to the profiler only when it saw
                # the block's allocation under a memory profiler: watch the step before the profiled
                # one (no stacks, no shapes), so the gradients and AdamW moments it makes are known
                self.watch = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
                self.watch.__enter__()
            if batch_idx == len(batches) - 1:
                self.known = known_blocks(pl_module, trainer.optimizers)
                self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                                       record_shapes=categories, with_stack=True)
                self.profiler.__enter__()
            StepPeaks.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            StepPeaks.stop()
            if batch_idx == len(batches) - 2:
                self.watch.__exit__(None, None, None)
                self.watch = None
            if self.profiler is not None and batch_idx == len(batches) - 1:
                self.profiler.__exit__(None, None, None)

    callback = ProfileLast()
    fit_steps(module, batches, threads, callback)
    out = peak_allocations(callback.profiler, callback.known, top)
    if categories:
        out.update(category_peaks(callback.profiler))
    out["step_rss_peaks_mb"] = list(StepPeaks.peaks)  # the last one under the profiler (its buffers included)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--method", default="sft", choices=("sft", "dpo"))
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--optimizer-in-backward", action="store_true", help="the module's optimizer_in_backward")
    parser.add_argument("--release-host-memory", choices=("phases", "layers"), help="the module's release_host_memory")
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--completion-length", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=1, help="steps before the analysed one (the AdamW moments exist from the second step on)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-categories", action="store_true",
                        help="skip torch's category split (its analysis holds several GiB at the long shape)")
    parser.add_argument("--top", type=int, default=15, help="how many of the largest live blocks to list")
    parser.add_argument("--malloc", action="store_true", help="no profiler: sample resident memory and glibc's heap "
                        "accounting through the last step (`MallocSampler`) instead")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    module, batches = build(args.method, args.model, args.gradient_checkpointing, args.prompt_length,
                            args.completion_length, args.warmup + 1, args.optimizer_in_backward, args.release_host_memory)
    gc = "on" if args.gradient_checkpointing else "off"
    if args.malloc:
        result = {"config": vars(args), **sample_last_step(module, batches, args.threads)}
        print(f"{args.method} gc={gc}: step resident peaks {[round(p) for p in result['step_rss_peaks_mb']]} MiB; "
              f"before the last step {json.dumps({k: round(v) for k, v in result['before_last_step'].items()})}; "
              f"at its resident peak {json.dumps({k: round(v) for k, v in result['at_rss_peak'].items()})}", flush=True)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=2))
        return result
    result = {"config": vars(args), **profile_last_step(module, batches, args.threads, not args.no_categories, args.top)}
    print(f"{args.method} gc={gc}: allocated peak {result['allocated_peak_mb']:.0f} MiB, in the {result['peak_at']['phase']} "
          f"at {result['peak_at']['where']}", flush=True)
    for row in result["live_by_origin_mb"][: args.top]:
        print(f"  {row['mb']:8.1f} MiB  {row['phase']:<24} {row['origin']}")
    if "peak_mb" in result:
        print(f"{args.method} gc={gc}: live tensor peak {result['peak_mb']:.0f} MiB = "
              + ", ".join(f"{k} {v:.0f}" for k, v in result["at_peak_mb"].items() if v) + " | each category's own peak: "
              + ", ".join(f"{k} {v:.0f}" for k, v in result["category_peaks_mb"].items() if v), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
