"""LoRA vs full fine-tuning, and TRL with `peft_config`: peak step memory and step time.

    python -m benchmarks.bench_lora --model smollm2-135m-instruct --methods dpo,grpo,ppo \
        --variants full,lora,trl_lora --rounds 2 --steps 3 --json benchmarks/results/lora_smollm2.json

For each method (DPO, GRPO, PPO) the workload of its own benchmark (`bench_dpo.py`,
`bench_grpo.py`, `bench_ppo.py`: same rows, lengths, seeds, learning rates) runs as

- `full`: our module, full fine-tuning (as in that benchmark);
- `lora`: our module with `lora: {r, alpha, target_modules: all-linear}` (`--lora-r`,
  `--lora-alpha`): one frozen base; the reference is the base with the adapter disabled; PPO's
  reward model is a LoRA reward adapter with the same head as the full run's reward model (so
  the same rewards), the value a second adapter started from it (D22);
- `trl_lora` (DPO, GRPO: TRL in `--trl-python`, default /tmp/benchvenv; PPO: TRL 1.12's
  `trl.experimental.ppo.PPOTrainer` in `--trl-ppo-python`, default /tmp/benchvenv-ppo): TRL's
  trainer with `peft_config` = the same `peft.LoraConfig` (TRL then uses the base with the
  adapter disabled as its reference; TRL's PPO keeps separate reward and value models);
- `trl_full`: TRL's trainer as in the method's benchmark.

Every worker is its own subprocess (its peak memory is its own), the variants alternate within
each round (A/B interleaving), and the report gives per variant the median step time over the
rounds and the largest training-step peak RSS (`common.StepPeaks`: VmHWM reset right before each
step; it includes the resident weights), then the ratios the goals name: LoRA PPO / full PPO
peak memory (goal <= 0.5), LoRA DPO / TRL LoRA DPO peak memory (goal <= 0.7) and step times.
Our interleaved bare-model steps are off (`--no-bare`): the overhead ratio is the method
benchmarks' business. Timings are only meaningful on a quiet machine (benchmarks/README.md).

Where a LoRA DPO step's memory goes, phase by phase: `bench_lora_phases.py` (also run as
`python -m benchmarks.bench_lora --phases ...`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Sequence

from benchmarks.common import REPO, WorkerResult, parse_config, setup_worker
from benchmarks.lora_common import lora_parser, lora_spec, parse_lora_args, peft_config, write_json

METHODS = ("dpo", "grpo", "ppo")
VARIANTS = ("full", "lora", "trl_full", "trl_lora")
GOALS = {"ppo_lora_over_full_peak": 0.5, "dpo_lora_over_trl_lora_peak": 0.7}


def _bench(method: str):
    import importlib

    return importlib.import_module(f"benchmarks.bench_{method}")


# --------------------------------------------------------------------------------------------
# workers: the method benchmark's own worker, with LoRA switched on
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def lora_reward_dir(cfg, tokenizer, spec) -> Iterator[str]:
    """PPO, ours with LoRA: the reward model of `bench_ppo.reward_model_dir` (the policy's weights,
    a D11 head seeded by `cfg.seed`) as a LoRA reward adapter with that head (B = 0: the same
    rewards), so policy, value and reward share one base."""
    import torch

    from lit_rlhf import models
    from lit_rlhf.modules import RewardModule

    with tempfile.TemporaryDirectory(prefix="lit_rlhf_bench_lora_rm_") as path:
        torch.manual_seed(cfg.seed)
        head = models.load_scalar_model(cfg.model, tokenizer, "float32").head
        reward = RewardModule(model=cfg.model, lora=spec)
        reward.reward_model.head.load_state_dict(head.state_dict())
        reward.export_hf(path)
        del reward
        yield str(Path(path) / "adapter")


def ours_lora(method: str, cfg, spec: dict[str, Any]) -> WorkerResult:
    import lit_rlhf.modules as modules

    bench = _bench(method)
    name = {"dpo": "DPOModule", "grpo": "GRPOModule", "ppo": "PPOModule"}[method]
    cls = getattr(modules, name)
    setattr(modules, name, functools.partial(cls, lora=spec))  # the worker imports it at call time
    if method == "ppo":
        bench.reward_model_dir = lambda cfg, tokenizer: lora_reward_dir(cfg, tokenizer, spec)
    result = bench.ours(cfg)
    result.framework = "lora"
    return result


def trl_lora(method: str, cfg, spec: dict[str, Any]) -> WorkerResult:
    """TRL's trainer of the method benchmark with `peft_config` and no explicit reference."""
    config = peft_config(spec)
    if method == "ppo":
        from trl.experimental.ppo import PPOTrainer as trainer_cls
    elif method == "dpo":
        from trl import DPOTrainer as trainer_cls
    else:
        from trl import GRPOTrainer as trainer_cls
    original = trainer_cls.__init__

    @functools.wraps(original)
    def with_peft(self, *args, **kwargs):
        if "ref_model" in kwargs:
            kwargs["ref_model"] = None  # TRL's reference is then the base with the adapter disabled
        return original(self, *args, peft_config=config, **kwargs)

    trainer_cls.__init__ = with_peft
    if method == "dpo":  # bench_dpo.trl builds a reference copy that with_peft drops: build none
        from lit_rlhf import models

        models.frozen_copy = lambda model: None
    result = _bench(method).trl(cfg)
    result.framework = "trl_lora"
    return result


def worker(method: str, variant: str, argv: Sequence[str], spec: dict[str, Any]) -> WorkerResult:
    from benchmarks.common import _with_step_peak

    bench = _bench(method)
    cfg, _ = parse_config(argv, f"{method} worker", getattr(bench, "_extra", None))
    cfg.no_bare = True
    setup_worker(cfg)
    if variant == "full":
        result = bench.ours(cfg)
        result.framework = "full"
    elif variant == "trl_full":
        result = bench.trl(cfg)
        result.framework = "trl_full"
    elif variant == "lora":
        result = ours_lora(method, cfg, spec)
    else:
        result = trl_lora(method, cfg, spec)
    return _with_step_peak(result)


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------


def python_for(variant: str, method: str, ns) -> str:
    if not variant.startswith("trl"):
        return sys.executable
    return ns.trl_ppo_python if method == "ppo" else ns.trl_python


def run_worker(method: str, variant: str, passthrough: list[str], ns) -> WorkerResult:
    with tempfile.TemporaryDirectory(prefix="lit_rlhf_bench_lora_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [python_for(variant, method, ns), "-m", "benchmarks.bench_lora", "--lora-r", str(ns.lora_r),
               "--lora-alpha", str(ns.lora_alpha), "--worker-variant", f"{method}:{variant}", "--worker-result", str(out),
               "--", *passthrough]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{method}/{variant} worker failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
        return WorkerResult(**json.loads(out.read_text()))


def report(results: dict[str, dict[str, list[WorkerResult]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"methods": {}, "ratios": {}}
    for method, by_variant in results.items():
        entry = {}
        for variant, runs in by_variant.items():
            steps = [t for r in runs for t in r.step_times]
            entry[variant] = {
                "peak_step_rss_mb": max(r.peak_rss_mb for r in runs),
                "peak_step_rss_mb_per_round": [round(r.peak_rss_mb, 1) for r in runs],
                "step_time_median_s": statistics.median(steps),
                "step_time_median_per_round_s": [statistics.median(r.step_times) for r in runs],
                "optimizer_steps_per_step": runs[0].optimizer_steps_per_step,
            }
        out["methods"][method] = entry
        for a, b in (("lora", "full"), ("lora", "trl_lora"), ("trl_lora", "trl_full")):
            if a in entry and b in entry:
                out["ratios"][f"{method}_{a}_over_{b}_peak"] = entry[a]["peak_step_rss_mb"] / entry[b]["peak_step_rss_mb"]
                out["ratios"][f"{method}_{a}_over_{b}_step_time"] = entry[a]["step_time_median_s"] / entry[b]["step_time_median_s"]
    return out


def format_report(out: dict[str, Any]) -> str:
    lines = []
    for method, entry in out["methods"].items():
        for variant, e in entry.items():
            lines.append(f"{method:>4} {variant:>8}: peak step RSS {e['peak_step_rss_mb']:8.0f} MiB, "
                         f"step median {e['step_time_median_s']:.3f}s (per round "
                         f"{', '.join(f'{x:.3f}' for x in e['step_time_median_per_round_s'])})")
    for name, value in out["ratios"].items():
        goal = GOALS.get(name)
        lines.append(f"{name}: {value:.3f}" + (f" (goal <= {goal})" if goal is not None else ""))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--phases" in argv:  # where a LoRA DPO step's memory goes
        from benchmarks import bench_lora_phases

        return bench_lora_phases.main([a for a in argv if a != "--phases"])
    parser = lora_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--variants", default="full,lora,trl_lora")
    parser.add_argument("--trl-ppo-python", default="/tmp/benchvenv-ppo/bin/python")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--phases", action="store_true", help="run bench_lora_phases.py with the other flags")
    parser.add_argument("--worker-variant", help=argparse.SUPPRESS)
    ns, passthrough = parse_lora_args(parser, argv)
    spec = lora_spec(ns)
    if ns.worker_variant:
        method, variant = ns.worker_variant.split(":")
        result = worker(method, variant, passthrough, spec)
        Path(ns.worker_result).write_text(json.dumps(asdict(result)))
        return None
    methods = [m for m in ns.methods.split(",") if m]
    variants = [v for v in ns.variants.split(",") if v]
    for name, allowed, given in (("method", METHODS, methods), ("variant", VARIANTS, variants)):
        unknown = [g for g in given if g not in allowed]
        if unknown:
            raise SystemExit(f"unknown {name}(s) {unknown}; expected some of {list(allowed)}")
    passthrough = [a for a in passthrough if a != "--no-bare"]
    results: dict[str, dict[str, list[WorkerResult]]] = {m: {} for m in methods}
    for round_index in range(ns.rounds):
        for method in methods:
            for variant in variants:  # interleaved: every variant once per round
                print(f"[lora] round {round_index + 1}/{ns.rounds}: {method} {variant} ...", file=sys.stderr, flush=True)
                results[method].setdefault(variant, []).append(run_worker(method, variant, passthrough, ns))
    out = report(results)
    out["config"] = {"argv": argv, "lora": spec, "load_average": os.getloadavg()}
    print(format_report(out))
    write_json(ns.json, out)
    return out


if __name__ == "__main__":
    main()
