"""Shared harness of the method benchmarks: data, timers, the bare-model baseline, TRL runs, reports.

Every `benchmarks/bench_<method>.py` defines two workers on the same model, data, batch size and
lengths and hands them to `run_benchmark`:

- `ours(cfg) -> WorkerResult`: the lit_rlhf module fitted by a plain `lightning.Trainer` (CPU,
  float32, no logger/checkpoint/progress bar) with `StepTimer`, then the **bare model work** the
  step cannot avoid, run on the same batch with plain torch/transformers calls right after each
  step, in the same process and with the module's own optimizer (`BareInterleave`);
- `trl(cfg) -> WorkerResult`: the matching TRL trainer with `trl_step_timer()` (only when TRL,
  the optional `bench` extra, is importable).

`run_benchmark` alternates the workers, each in a fresh subprocess (ours, TRL, ours, TRL, ... for
`--rounds` rounds) so that the peak resident memory (`ru_maxrss`) of each is its own, and reports
per framework the median / min / max time per optimizer step over the measured steps (after
`--warmup` steps), tokens (and completions) per second, peak memory, for the online methods the
generation and update times, our **overhead ratio** (step time / bare model work time) and the
ratio ours / TRL measured side by side. `--json` writes everything, with the machine, versions,
load average and date.

Fixed seeds, float32, `torch.set_num_threads(--threads)` (2 by default) in every worker.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

REPO = Path(__file__).resolve().parents[1]
TRL_TOKEN = "trl"
OURS = "ours"
TARGET_OVERHEAD = 1.15


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    """What one benchmark run measures (every field is a command-line flag, `_` -> `-`).

    Args:
        model: a lit_rlhf builtin model name (`tiny-random-llama`, `smollm2-135m-instruct`) or path.
        batch_size: pairs (Reward, DPO), rows (KTO, DRO-V) or prompts (PPO, GRPO) per step.
        prompt_length: prompt tokens per row (every row has exactly this many).
        completion_length: completion tokens per row (EOS included); online: `max_new_tokens`.
        warmup: steps run and discarded before measuring.
        steps: measured optimizer steps (the median is over these).
        rounds: alternating rounds (ours, TRL) in fresh processes.
        frameworks: `auto` (ours, plus TRL when importable), `ours`, `trl` or `ours,trl`.
        threads: `torch.set_num_threads` in every worker.
        log_every: both frameworks record their training stats every this many steps (Lightning's
            `log_every_n_steps`, TRL's `logging_steps`); 10 is TRL's default and our configs'
            offline setting. Metrics are computed every step either way.
        seed: seed of the data, the weights' heads and the sampling.
        gradient_checkpointing: recompute activations in the backward pass, on both sides (ours:
            the module's `gradient_checkpointing`; TRL: `TrainingArguments.gradient_checkpointing`,
            both non-reentrant).
        in_process: run the workers in this process (no memory isolation; for the smoke test).
        no_bare: skip our interleaved bare-model steps (no overhead ratio): our step memory
            without the heap those steps leave behind in the same process.
        profile: print a cProfile summary (top functions by cumulative time) of each worker's fit.
        release_host_memory: ours with the modules' `release_host_memory` (`phases` or `layers`):
            the heap a step frees goes back to the system (glibc's `malloc_trim`,
            `lit_rlhf.host_memory`).
        accelerator: `cpu` (the CPU tables) or `gpu` (one CUDA device: `benchmarks.gpu`); both
            sides train on it (TRL's `use_cpu` follows).
        precision: Lightning's precision on our side (`32-true` or `bf16-mixed`); TRL's `bf16`
            follows (`bf16-mixed` is TRL's `bf16=True`: float32 weights, bf16 autocast).
        json: write the full result there.
    """

    model: str = "tiny-random-llama"
    batch_size: int = 4
    prompt_length: int = 128
    completion_length: int = 32
    warmup: int = 1
    steps: int = 5
    rounds: int = 2
    frameworks: str = "auto"
    threads: int = 2
    log_every: int = 10
    seed: int = 0
    gradient_checkpointing: bool = False
    in_process: bool = False
    no_bare: bool = False
    profile: bool = False
    release_host_memory: str | None = None
    accelerator: str = "cpu"
    precision: str = "32-true"
    json: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps


@dataclass
class WorkerResult:
    """What one worker (one framework, one round) measured. Times in seconds, memory in MiB."""

    framework: str
    step_times: list[float]  # measured optimizer steps (online: per rollout, see `optimizer_steps_per_step`)
    peak_rss_mb: float  # largest training-step peak (`StepPeaks`); the process peak where unavailable
    tokens_per_step: float  # non-pad tokens processed per step (online: prompt + generated tokens)
    completions_per_step: float = 0.0
    optimizer_steps_per_step: int = 1
    generation_times: list[float] = field(default_factory=list)  # online: `generate` alone
    rollout_times: list[float] = field(default_factory=list)  # online: generate + score (old/ref logps, rewards)
    update_times: list[float] = field(default_factory=list)  # online: the optimisation part
    bare_times: list[float] = field(default_factory=list)  # the bare model work of one step (ours only)
    bare_parts: dict[str, float] = field(default_factory=dict)  # median seconds of each bare part
    info: dict[str, Any] = field(default_factory=dict)
    profile: str = ""


def parse_config(argv: Sequence[str] | None, description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None,
                 **defaults: Any) -> tuple[BenchConfig, argparse.Namespace]:
    """Parse the common flags (see `BenchConfig`) plus the script's own (`extra`), and the worker flags."""
    base = BenchConfig(**defaults)
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for name, value in asdict(base).items():
        if name == "extra":
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true", default=value)
        else:
            parser.add_argument(flag, type=type(value) if value is not None else str, default=value)
    if extra is not None:
        extra(parser)
    parser.add_argument("--worker", choices=(OURS, TRL_TOKEN), help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    ns = parser.parse_args(list(argv) if argv is not None else None)
    known = {k: getattr(ns, k) for k in asdict(base) if k != "extra"}
    cfg = BenchConfig(**known, extra={k: v for k, v in vars(ns).items() if k not in known and not k.startswith("worker")})
    for name in ("batch_size", "prompt_length", "completion_length", "steps", "rounds", "threads", "log_every"):
        if getattr(cfg, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if cfg.warmup < 0:
        raise SystemExit(f"--warmup must be >= 0, got {cfg.warmup}")
    return cfg, ns


def trl_available() -> bool:
    return importlib.util.find_spec("trl") is not None


def frameworks_of(cfg: BenchConfig, has_trl_worker: bool) -> list[str]:
    if cfg.frameworks == "auto":
        return [OURS] + ([TRL_TOKEN] if has_trl_worker and trl_available() else [])
    names = [n.strip() for n in cfg.frameworks.split(",") if n.strip()]
    for name in names:
        if name not in (OURS, TRL_TOKEN):
            raise SystemExit(f"unknown framework {name!r} in --frameworks; expected 'ours' and/or 'trl'")
    if TRL_TOKEN in names and not has_trl_worker:
        raise SystemExit("this method has no TRL counterpart to run (see benchmarks/RESULTS.md)")
    if TRL_TOKEN in names and not trl_available():
        raise SystemExit("--frameworks asks for trl but it is not importable: pip install -e '.[bench]' (or trl)")
    return names


def setup_worker(cfg: BenchConfig) -> None:
    """Threads, seeds and float32 for a worker."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    torch.set_default_dtype(torch.float32)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class StepPeaks:
    """Peak resident memory of each training step: the kernel's high-water mark (VmHWM) reset
    just before the step (`/proc/self/clear_refs`, Linux) and read right after it.

    The worker's reported peak is the largest step peak: the memory training needs, without the
    model loading before it or, on our side, the interleaved bare-model steps after each step
    (which run in the same process). Where the reset is unavailable, nothing is recorded and the
    process peak (`peak_rss_mb`) is reported instead."""

    peaks: list[float] = []  # this process's step peaks (each worker runs in its own process)
    process_peak = 0.0  # the whole process's peak: resetting VmHWM also resets ru_maxrss
    cuda_peaks: list[float] = []  # on a GPU: each step's peak allocated device memory (MiB)
    first_step: list[float] = []  # the first step's start and end (perf_counter): the set-up ends there

    @staticmethod
    def start() -> None:
        _synchronize()  # on a GPU the previous step's kernels end before this step's clock starts
        if not StepPeaks.first_step:
            StepPeaks.first_step.append(time.perf_counter())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        StepPeaks.process_peak = max(StepPeaks.process_peak, peak_rss_mb())  # before the reset
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            StepPeaks._unavailable = True

    @staticmethod
    def stop() -> None:
        _synchronize()  # the step's kernels are in its time
        if len(StepPeaks.first_step) == 1:
            StepPeaks.first_step.append(time.perf_counter())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            StepPeaks.cuda_peaks.append(torch.cuda.max_memory_allocated() / 2**20)
        if getattr(StepPeaks, "_unavailable", False):
            return
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                StepPeaks.peaks.append(int(line.split()[1]) / 1024.0)


# --------------------------------------------------------------------------------------------
# data: identical token ids for both frameworks
# --------------------------------------------------------------------------------------------


def _bundled_tldr() -> list[dict[str, Any]]:
    path = REPO / "lit_rlhf" / "data" / "bundled" / "tldr_comparisons.train.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def token_rows(tokenizer, n: int, prompt_length: int, completion_length: int) -> list[dict[str, list[int]]]:
    """`n` rows of token ids with EXACTLY `prompt_length` prompt and `completion_length` completion
    tokens (the last one EOS), from the bundled TL;DR comparisons.

    Prompts are TL;DR queries (D2) of consecutive posts, joined and cut to their last
    `prompt_length` tokens (so each ends with `TL;DR:`); completions are the two summaries
    (chosen = the preferred one) repeated to length. Returns dicts with `prompt_ids`,
    `chosen_ids`, `rejected_ids`.
    """
    from lit_rlhf.data.formatting import format_tldr_query

    records = _bundled_tldr()
    eos = tokenizer.eos_token_id
    rows = []
    for i in range(n):
        parts, ids = [], []
        j = i
        while len(ids) < prompt_length:
            info = records[j % len(records)]["info"]
            parts.insert(0, format_tldr_query(info["subreddit"], info["title"], info["post"]))
            ids = tokenizer("\n\n".join(parts), add_special_tokens=False)["input_ids"]
            j += 1
        record = records[i % len(records)]
        summaries = [s["text"] for s in record["summaries"]]
        chosen, rejected = summaries[record["choice"]], summaries[1 - record["choice"]]

        def fill(text: str) -> list[int]:
            piece = tokenizer(text, add_special_tokens=False)["input_ids"] or [eos]
            out = []
            while len(out) < completion_length - 1:
                out += piece
            return out[: completion_length - 1] + [eos]

        rows.append({"prompt_ids": list(ids[-prompt_length:]), "chosen_ids": fill(chosen), "rejected_ids": fill(rejected)})
    return rows


def step_rows(cfg: BenchConfig, tokenizer) -> list[list[dict[str, list[int]]]]:
    """`token_rows` for every step of `cfg`: one list of `batch_size` rows per step."""
    rows = token_rows(tokenizer, cfg.batch_size * cfg.total_steps, cfg.prompt_length, cfg.completion_length)
    return [rows[i * cfg.batch_size: (i + 1) * cfg.batch_size] for i in range(cfg.total_steps)]


def preference_batch(rows: Sequence[dict[str, list[int]]]):
    """A `PreferenceBatch` (chosen rows first) of equal-length rows: no padding at all."""
    from lit_rlhf.types import PreferenceBatch

    chosen = [r["prompt_ids"] + r["chosen_ids"] for r in rows]
    rejected = [r["prompt_ids"] + r["rejected_ids"] for r in rows]
    ids = torch.tensor(chosen + rejected, dtype=torch.long)  # (2B, P+C)
    prompt_len = len(rows[0]["prompt_ids"])
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, prompt_len:] = True
    return PreferenceBatch(ids, torch.ones_like(ids, dtype=torch.bool), loss_mask,
                           torch.full((ids.shape[0],), prompt_len, dtype=torch.long), meta={"index": list(range(len(rows))) * 2})


def single_batch(rows: Sequence[dict[str, list[int]]], labels: Sequence[bool], rewards: Sequence[float] | None = None):
    """A `SingleBatch`: row i is prompt i + its chosen (label True) or rejected completion."""
    from lit_rlhf.types import SingleBatch

    seqs = [r["prompt_ids"] + (r["chosen_ids"] if good else r["rejected_ids"]) for r, good in zip(rows, labels)]
    ids = torch.tensor(seqs, dtype=torch.long)  # (B, P+C)
    prompt_len = len(rows[0]["prompt_ids"])
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, prompt_len:] = True
    return SingleBatch(
        ids, torch.ones_like(ids, dtype=torch.bool), loss_mask, torch.full((len(rows),), prompt_len, dtype=torch.long),
        rewards=None if rewards is None else torch.tensor(rewards, dtype=torch.float32),
        labels=torch.tensor(list(labels), dtype=torch.bool), meta={"index": list(range(len(rows)))},
    )


def prompt_texts(tokenizer, rows: Sequence[dict[str, list[int]]]) -> list[str]:
    """The prompts as text (what TRL's GRPO takes); re-tokenised by both frameworks alike."""
    return [tokenizer.decode(r["prompt_ids"], skip_special_tokens=False) for r in rows]


def prompt_batch(tokenizer, texts: Sequence[str]):
    """A left-padded `PromptBatch` of `texts`, tokenised as TRL does (`tokenizer(text)`)."""
    from lit_rlhf.types import PromptBatch

    encoded = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.bool)
    for i, e in enumerate(encoded):
        ids[i, width - len(e):] = torch.tensor(e)
        mask[i, width - len(e):] = True
    return PromptBatch(ids, mask, meta={"prompt": list(texts)})


def alpha_fraction_reward(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
    """A cheap reward function shared by both frameworks' online runs: fraction of letters."""
    return [sum(ch.isalpha() for ch in c) / max(1, len(c)) for c in completions]


# --------------------------------------------------------------------------------------------
# timers
# --------------------------------------------------------------------------------------------


def _lightning_callback_base():
    from lightning.pytorch import Callback

    return Callback


class StepTimer(_lightning_callback_base()):
    """Wall time of every training batch (one rollout for online methods), from
    `on_train_batch_start` to `on_train_batch_end` (after the optimizer step)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._started = 0.0
        self.first_started: float | None = None  # the first step's start (set-up time ends there)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        StepPeaks.start()
        self._started = time.perf_counter()
        self.first_started = self.first_started or self._started

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        StepPeaks.stop()  # synchronizes a GPU first
        self.times.append(time.perf_counter() - self._started)


def _synchronize() -> None:
    """Wait for queued GPU work (a no-op on the CPU), so a wall-clock timer measures the work."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class CallTimer:
    """Wrap a bound method (`obj.name`) and record the wall time of every call, and
    `measure(result, *args, **kwargs)` of every result in `values` when given."""

    def __init__(self, obj: Any, name: str, measure: Callable[..., float] | None = None) -> None:
        self.times: list[float] = []
        self.values: list[float] = []
        self._measure = measure
        self._obj, self._name = obj, name
        self._inner = getattr(obj, name)
        setattr(obj, name, self)

    def restore(self) -> None:
        """Put the wrapped callable back (needed when `obj` outlives the run: a module's function)."""
        setattr(self._obj, self._name, self._inner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _synchronize()
        started = time.perf_counter()
        try:
            result = self._inner(*args, **kwargs)
            _synchronize()  # on a GPU the call's kernels count in its own time, not the next part's
        finally:
            self.times.append(time.perf_counter() - started)
        if self._measure is not None:
            self.values.append(float(self._measure(result, *args, **kwargs)))
        return result

    def per_step(self, calls_per_step: int = 1) -> list[float]:
        """Call times summed in groups of `calls_per_step`."""
        return [sum(self.times[i: i + calls_per_step]) for i in range(0, len(self.times), calls_per_step)]


class BareInterleave(_lightning_callback_base()):
    """After every training batch (and after `StepTimer` has stopped its clock), run the bare
    model work `bare(batch, optimizer)` on the same batch with the module's own optimizer (so no
    extra optimizer state), and time it. Interleaving pairs each step with a bare step taken
    moments later, so a load change on a shared machine hits both alike."""

    def __init__(self, bare: Callable[[Any, Any], None]) -> None:
        self.bare = bare
        self.times: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        optimizer = trainer.optimizers[0]
        optimizer.zero_grad(set_to_none=True)
        was_training = pl_module.training
        # an optimizer stepped in the backward pass (`optimizer_in_backward`) is a plain AdamW for
        # the bare work: the textbook backward, then one step of every parameter
        suspended = getattr(optimizer, "suspended", contextlib.nullcontext)
        with torch.enable_grad(), suspended():
            started = time.perf_counter()
            self.bare(batch, optimizer)
            self.times.append(time.perf_counter() - started)
        optimizer.zero_grad(set_to_none=True)
        pl_module.train(was_training)


def _identity(item: Any) -> Any:
    return item


def fit_ours(module, batches: Sequence[Any], cfg: BenchConfig, bare: Callable[[Any, Any], None] | None = None,
             optimizer_steps_per_batch: int = 1) -> tuple[list[float], list[float]]:
    """Fit `module` on `batches` (one per step) with a plain Lightning Trainer.

    Returns the measured step times and the interleaved bare-work times (`BareInterleave`, when
    `bare` is given), the first `cfg.warmup` of each dropped."""
    from lightning import Trainer
    from torch.utils.data import DataLoader

    timer = StepTimer()
    bare = None if cfg.no_bare else bare
    callbacks = [timer] + ([BareInterleave(bare)] if bare is not None else [])
    trainer = Trainer(
        accelerator=cfg.accelerator, devices=1, precision=cfg.precision, max_steps=len(batches) * optimizer_steps_per_batch,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks, log_every_n_steps=cfg.log_every,
    )
    loader = DataLoader(list(batches), batch_size=None, shuffle=False, collate_fn=_identity)
    trainer.fit(module, train_dataloaders=loader)
    if len(timer.times) != len(batches):
        raise RuntimeError(f"expected {len(batches)} training steps, timed {len(timer.times)}")
    bare_times = callbacks[1].times[cfg.warmup:] if bare is not None else []
    return timer.times[cfg.warmup:], bare_times


def trl_step_timer():
    """A transformers `TrainerCallback` timing each optimizer step (on_step_begin -> on_step_end)."""
    from transformers import TrainerCallback

    class TRLStepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._started = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            StepPeaks.start()
            self._started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            StepPeaks.stop()  # synchronizes a GPU first
            self.times.append(time.perf_counter() - self._started)

    return TRLStepTimer()


def trl_training_args(cfg: BenchConfig, output_dir: str, **overrides: Any) -> dict[str, Any]:
    """TrainingArguments shared by every TRL run: our device and precision (`--accelerator`,
    `--precision`), no eval/saving/reporting, no gradient checkpointing unless
    `--gradient-checkpointing` (then non-reentrant, as ours), workers 0, the same steps, batch
    size, seed and schedule as ours."""
    args = dict(
        output_dir=output_dir, per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=1,
        max_steps=cfg.total_steps, learning_rate=1e-5, lr_scheduler_type="cosine", warmup_steps=0, weight_decay=0.0,
        report_to=[], use_cpu=cfg.accelerator == "cpu", bf16=cfg.precision.startswith("bf16"), fp16=False, dataloader_num_workers=0, dataloader_pin_memory=False,
        save_strategy="no", eval_strategy="no", logging_steps=cfg.log_every, disable_tqdm=True, seed=cfg.seed, data_seed=cfg.seed,
        gradient_checkpointing=cfg.gradient_checkpointing, max_grad_norm=0.0,
    )
    if cfg.gradient_checkpointing:
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    args.update(overrides)
    return args


class PartTimer:
    """Accumulate the time of named parts inside a bare step (`with parts("forward"): ...`)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self._current: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self._current[name] = self._current.get(name, 0.0) + time.perf_counter() - started

    def end_step(self) -> None:
        for name, value in self._current.items():
            self.samples.setdefault(name, []).append(value)
        self._current = {}

    def medians(self, skip: int) -> dict[str, float]:
        return {name: statistics.median(values[skip:] or values) for name, values in self.samples.items()}


def completion_logps_sum(logits: Tensor, input_ids: Tensor, loss_mask: Tensor) -> Tensor:
    """Bare-baseline log-prob of the completion tokens, summed per row: (N, T, V) -> (N,).

    The minimal computation any preference loss needs from the logits (log-softmax + gather)."""
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (N, T-1)
    return (logps * loss_mask[:, 1:]).sum(-1)


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------


def summary(values: Sequence[float]) -> dict[str, float]:
    values = list(values)
    if not values:
        return {}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def machine_info(threads: int) -> dict[str, Any]:
    import lightning
    import transformers

    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu, "cores": os.cpu_count(), "torch_threads": threads, "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__, "lightning": lightning.__version__,
    }
    if trl_available():
        import trl

        info["trl"] = trl.__version__
    return info


def _run_worker(script_module: str, worker: Callable[[BenchConfig], WorkerResult], cfg: BenchConfig,
                argv: Sequence[str], name: str) -> WorkerResult:
    if cfg.in_process:
        setup_worker(cfg)
        StepPeaks.peaks.clear()
        StepPeaks.first_step.clear()
        started = time.perf_counter()
        result = _with_step_peak(_profiled(worker, cfg))
        if len(StepPeaks.first_step) == 2:  # where the set-up time goes: before the first step, and in it
            first, end = StepPeaks.first_step
            result.info.update(before_first_step_s=round(first - started, 3), first_step_s=round(end - first, 3))
        return result
    with tempfile.TemporaryDirectory(prefix="lit_rlhf_bench_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", script_module, *argv, "--worker", name, "--worker-out", str(out)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{name} worker failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
        return WorkerResult(**json.loads(out.read_text()))


def _profiled(worker: Callable[[BenchConfig], WorkerResult], cfg: BenchConfig) -> WorkerResult:
    if not cfg.profile:
        return worker(cfg)
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    result = profiler.runcall(worker, cfg)
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(40)
    result.profile = stream.getvalue()
    return result


def _with_step_peak(result: WorkerResult) -> WorkerResult:
    """Report the largest training-step peak (`StepPeaks`) as the worker's peak memory, the
    process peak next to it in `info` (and on a GPU the largest step peak of allocated device
    memory, `info["cuda_step_peak_mb"]`)."""
    if StepPeaks.cuda_peaks:
        result.info["cuda_step_peak_mb"] = round(max(StepPeaks.cuda_peaks), 1)
        StepPeaks.cuda_peaks.clear()
    if StepPeaks.peaks:
        result.info["process_peak_rss_mb"] = max(StepPeaks.process_peak, result.peak_rss_mb)
        result.info["step_peaks_mb"] = [round(peak, 1) for peak in StepPeaks.peaks]  # warm-up steps first
        result.peak_rss_mb = max(StepPeaks.peaks)
    StepPeaks.peaks.clear()
    StepPeaks.process_peak = 0.0
    return result


def worker_main(worker: Callable[[BenchConfig], WorkerResult], cfg: BenchConfig, out: str) -> None:
    setup_worker(cfg)
    result = _with_step_peak(_profiled(worker, cfg))
    Path(out).write_text(json.dumps(asdict(result)))


def aggregate(method: str, cfg: BenchConfig, results: list[WorkerResult], load_before: tuple, load_after: tuple) -> dict[str, Any]:
    """Per framework: step time median/min/max pooled over rounds, throughput, memory, overhead;
    the ratio ours / TRL from the pooled medians and from each round's pair."""
    out: dict[str, Any] = {
        "method": method, "model": cfg.model, "machine": machine_info(cfg.threads),
        "load_average_before": load_before, "load_average_after": load_after,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("json", "in_process", "profile")},
        "frameworks": {},
    }
    by_fw: dict[str, list[WorkerResult]] = {}
    for r in results:
        by_fw.setdefault(r.framework, []).append(r)
    for fw, runs in by_fw.items():
        steps = [t for r in runs for t in r.step_times]
        med = statistics.median(steps)
        per_opt = runs[0].optimizer_steps_per_step
        entry: dict[str, Any] = {
            "step_time_s": summary(steps),
            "optimizer_steps_per_step": per_opt,
            "time_per_optimizer_step_s": med / per_opt,
            "tokens_per_step": runs[0].tokens_per_step,
            "tokens_per_s": runs[0].tokens_per_step / med,
            "peak_rss_mb": max(r.peak_rss_mb for r in runs),
            "peak_rss_mb_per_round": [round(r.peak_rss_mb, 1) for r in runs],
            "step_median_per_round_s": [statistics.median(r.step_times) for r in runs],
            "info": runs[0].info,
        }
        if runs[0].completions_per_step:
            entry["completions_per_step"] = runs[0].completions_per_step
            entry["completions_per_s"] = runs[0].completions_per_step / med
        for key in ("generation_times", "rollout_times", "update_times"):
            pooled = [t for r in runs for t in getattr(r, key)]
            if pooled:
                entry[key.replace("_times", "_time_s")] = summary(pooled)
        if any(r.bare_times for r in runs):
            # each measured step over the bare step interleaved right after it, median of those
            ratios = [step / bare for r in runs for step, bare in zip(r.step_times, r.bare_times)]
            entry["bare_time_s"] = summary([t for r in runs for t in r.bare_times])
            entry["bare_parts_s"] = runs[0].bare_parts
            entry["overhead_ratio"] = summary(ratios)
        out["frameworks"][fw] = entry
    if OURS in by_fw and TRL_TOKEN in by_fw:
        ours, trl = out["frameworks"][OURS], out["frameworks"][TRL_TOKEN]
        pairs = [statistics.median(o.step_times) / statistics.median(t.step_times) for o, t in zip(by_fw[OURS], by_fw[TRL_TOKEN])]
        out["ours_over_trl"] = {
            "step_time": ours["step_time_s"]["median"] / trl["step_time_s"]["median"],
            "step_time_per_round": pairs,
            "peak_rss": ours["peak_rss_mb"] / trl["peak_rss_mb"],
        }
    return out


def format_report(result: dict[str, Any]) -> str:
    """A short human-readable report of `aggregate`'s result."""
    lines = [f"== {result['method']} on {result['model']} (threads {result['config']['threads']}, "
             f"load {result['load_average_before'][0]:.2f} -> {result['load_average_after'][0]:.2f})"]
    for fw, e in result["frameworks"].items():
        s = e["step_time_s"]
        line = (f"{fw:>5}: step median {s['median']:.3f}s (min {s['min']:.3f}, max {s['max']:.3f}, n {s['n']}), "
                f"{e['tokens_per_s']:.0f} tok/s")
        if "completions_per_s" in e:
            line += f", {e['completions_per_s']:.2f} completions/s"
        line += f", peak RSS {e['peak_rss_mb']:.0f} MiB"
        for key in ("generation_time_s", "rollout_time_s", "update_time_s"):
            if key in e:
                line += f", {key.replace('_time_s', '')} {e[key]['median']:.3f}s"
        if "overhead_ratio" in e:
            o = e["overhead_ratio"]
            line += (f", bare {e['bare_time_s']['median']:.3f}s -> overhead x{o['median']:.3f} "
                     f"(min {o['min']:.3f}, max {o['max']:.3f}; target <= {TARGET_OVERHEAD})")
        lines.append(line)
    if "ours_over_trl" in result:
        r = result["ours_over_trl"]
        lines.append(f"ours/TRL: step time x{r['step_time']:.3f} (per round {', '.join(f'{x:.3f}' for x in r['step_time_per_round'])}), "
                     f"peak RSS x{r['peak_rss']:.3f}")
    return "\n".join(lines)


def run_benchmark(
    method: str,
    script_module: str,
    argv: Sequence[str] | None,
    ours: Callable[[BenchConfig], WorkerResult],
    trl: Callable[[BenchConfig], WorkerResult] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
    **defaults: Any,
) -> dict[str, Any] | None:
    """Entry point of a benchmark script: parse flags, alternate the workers, report.

    Returns the aggregated result (also printed, and written to `--json` when given); in a worker
    subprocess, runs that worker and returns None.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg, ns = parse_config(argv, f"{method} benchmark (see benchmarks/README.md)", extra, **defaults)
    if ns.worker:
        worker_main(ours if ns.worker == OURS else trl, cfg, ns.worker_out)
        return None
    names = frameworks_of(cfg, trl is not None)
    load_before = os.getloadavg()
    results = []
    for round_index in range(cfg.rounds):
        for name in names:
            worker = ours if name == OURS else trl
            print(f"[{method}] round {round_index + 1}/{cfg.rounds}: {name} ...", file=sys.stderr, flush=True)
            result = _run_worker(script_module, worker, cfg, argv, name)
            if result.profile:
                print(f"---- cProfile of {name} (round {round_index + 1}) ----\n{result.profile}")
            results.append(result)
    out = aggregate(method, cfg, results, load_before, os.getloadavg())
    print(format_report(out))
    if cfg.json:
        Path(cfg.json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json).write_text(json.dumps(out, indent=2))
    return out
